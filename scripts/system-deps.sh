#!/usr/bin/env bash
# Debian tools the end-to-end tests drive: tmux (a real terminal) and OpenSSH (socket forwarding).
set -euo pipefail
need=()
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
command -v rsvg-convert >/dev/null 2>&1 || need+=(librsvg2-bin)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "system-deps: missing ${need[*]}; the tests that need them will be skipped" >&2
  fi
fi
