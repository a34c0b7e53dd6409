#!/usr/bin/env bash
# Debian tools the end-to-end tests drive: tmux (a real terminal), OpenSSH (socket forwarding),
# rsvg-convert (screenshots) and Chromium (the browser view).
set -euo pipefail
need=()
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
command -v rsvg-convert >/dev/null 2>&1 || need+=(librsvg2-bin)
# headless Chromium for the browser view's test (nnwatch serve), driven by Playwright
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "system-deps: missing ${need[*]}; the tests that need them will be skipped" >&2
  fi
fi
