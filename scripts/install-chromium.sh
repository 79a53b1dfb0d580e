#!/usr/bin/env bash
# Install Debian's `chromium` and the fonts the real-browser test needs (tests/test_browser.py).
#
# Playwright's own `playwright install` downloads a browser from a CDN that CI cannot reach,
# so the test drives the distribution's Chromium instead. The fonts: Liberation for Latin text,
# Noto CJK for the zh_CN edition and Noto Color Emoji for the verdicts (✅); without them the
# screenshots show boxes, and the browser test's glyph check fails. Idempotent and quiet:
# installs only what is missing (a Chromium named by MULTIGPU_LAB_CHROMIUM counts), with
# apt-get as root or through passwordless sudo, and otherwise only says why it did not; the
# browser test then fails in CI (CI=true) and is skipped elsewhere, with that reason.
set -euo pipefail

FONTS=(fonts-liberation fonts-noto-cjk fonts-noto-color-emoji)
wanted=()
have_chromium=""
for candidate in "${MULTIGPU_LAB_CHROMIUM:-}" chromium chromium-browser; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
    have_chromium=yes
    break
  fi
done
[ -n "$have_chromium" ] || wanted+=(chromium)
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in "${FONTS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || wanted+=("$pkg")
  done
fi
[ "${#wanted[@]}" -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no apt-get here; install Chromium and CJK and emoji fonts yourself" \
       "and set MULTIGPU_LAB_CHROMIUM=/path/to/chromium for the browser test." >&2
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-chromium: not root and no passwordless sudo; run" \
       "'sudo apt-get install ${wanted[*]}' for the browser test." >&2
  exit 0
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: installing ${wanted[*]} with apt-get (once) ..." >&2
# A fresh machine has no package lists; refresh them when a package has no candidate yet.
for pkg in "${wanted[@]}"; do
  if ! apt-cache policy "$pkg" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    "${as_root[@]}" apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    break
  fi
done
if ! "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${wanted[@]}" >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-chromium: apt-get install ${wanted[*]} failed (see above)." >&2
  exit 1
fi
command -v chromium >/dev/null 2>&1 || [ -n "$have_chromium" ] ||
  { echo "install-chromium: chromium still missing" >&2; exit 1; }
echo "install-chromium: ${wanted[*]} installed." >&2
