#!/usr/bin/env bash
# Install Debian's `chromium` for the real-browser test (tests/test_browser.py), if missing.
#
# Playwright's own `playwright install` downloads a browser from a CDN that CI cannot reach,
# so the test drives the distribution's Chromium instead. Idempotent and quiet: does nothing
# when a Chromium is already on PATH (or named by MULTIGPU_LAB_CHROMIUM), installs with apt-get
# as root (or through passwordless sudo), and otherwise only says why it did not; the browser
# test then fails in CI (CI=true) and is skipped elsewhere, with that reason.
set -euo pipefail

for candidate in "${MULTIGPU_LAB_CHROMIUM:-}" chromium chromium-browser; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no apt-get here; install Chromium yourself and set" \
       "MULTIGPU_LAB_CHROMIUM=/path/to/chromium for the browser test." >&2
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-chromium: not root and no passwordless sudo; run" \
       "'sudo apt-get install chromium fonts-liberation' for the browser test." >&2
  exit 0
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: installing Debian's chromium with apt-get (once) ..." >&2
# A fresh machine has no package lists; refresh them when chromium has no candidate yet.
if ! apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  "${as_root[@]}" apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
fi
# fonts-liberation: without any font, screenshots show boxes instead of text.
if ! "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
    chromium fonts-liberation >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-chromium: apt-get install chromium failed (see above)." >&2
  exit 1
fi
command -v chromium >/dev/null 2>&1 || { echo "install-chromium: chromium still missing" >&2; exit 1; }
echo "install-chromium: $(chromium --version 2>/dev/null || echo chromium) installed." >&2
