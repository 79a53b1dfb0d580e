# Multi-GPU Lab on a CUDA PyTorch image: JupyterLab on 8888 as a non-root user.
#   docker build -t multigpu-lab .
#   docker build --build-arg PIP_INDEX_URL=https://pypi.tuna.tsinghua.edu.cn/simple -t multigpu-lab .
#   docker run --gpus all --shm-size=8g -p 8888:8888 -e JUPYTER_TOKEN=choose-one multigpu-lab
# --shm-size matters: DataLoader workers pass batches through /dev/shm (Docker's default is 64 MB).
#
# PyTorch versions: the kit was tested with torch 2.14.1 and torchvision 0.29.1 (CUDA 13.0
# wheels), and the image installs exactly those, whatever the base image holds. Supported range:
# torch >= 2.6 (pyproject.toml; FSDP2's fully_shard is public from 2.6), but only 2.14.1 was run;
# to try another release: docker build --build-arg TORCH_VERSION=... --build-arg TORCHVISION_VERSION=...
ARG BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

# A PyPI mirror for networks where pypi.org is slow (the guide used Aliyun/Tsinghua mirrors).
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_TRUSTED_HOST=
ENV PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_TRUSTED_HOST=${PIP_TRUSTED_HOST} \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends git make procps psmisc iproute2 \
    && rm -rf /var/lib/apt/lists/*

# The checkout's folder belongs to the user: lessons write runs/ there, `make lab` writes lab/.
RUN useradd --create-home --uid 1000 lab \
    && install -d -o lab -g lab /home/lab/multigpu-lab
WORKDIR /home/lab/multigpu-lab

# Dependencies come from pyproject.toml alone (tests keep environment.yml in step with it), less
# the Makefile's SLOW_IMPORTS (seconds at every nbformat import, unused).
COPY --chown=lab:lab pyproject.toml README.md ./
COPY --chown=lab:lab helpers ./helpers
COPY --chown=lab:lab labtools ./labtools
RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && pip install -e '.[lab,frameworks]' \
    && pip uninstall --yes rfc3987-syntax \
    && python -m ipykernel install --sys-prefix --name multigpu-lab --display-name "Python 3 (Multi-GPU Lab)"
COPY --chown=lab:lab . .

USER lab
# The Chinese edition next to the English one (notebooks/zh_CN, see README "中文版"), and lab/,
# the learner's copy (exercises open, every edition; labtools/student.py), as `make lab` has it.
RUN python -m labtools.translate build zh_CN && python -m labtools.student --lab
EXPOSE 8888
# JupyterLab on lab/, refreshed first (a notebook the learner changed is kept); it reads the token
# from JUPYTER_TOKEN, and without one prints a random token at start. Instructors, on the answer
# key: docker run ... multigpu-lab jupyter lab --ip=0.0.0.0 --no-browser --notebook-dir=notebooks
CMD ["sh", "-c", "python -m labtools.student --lab && exec jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --notebook-dir=lab"]
