#!/usr/bin/env bash
# System packages the simulated fleet (capi_gpu_sim/hosts) needs on the machine running the tests.
#
# Why each one:
#   debootstrap      builds the cached bookworm minbase tree the simulated GEX131 hosts boot from
#   iproute2         ip netns / veth / addresses for each host's private /30
#   util-linux       nsenter, unshare, setpriv (boot of a host into its own namespaces)
#   mount            mount/umount (overlay views, lazy unmounts in the stale sweep)
#   openssh-client   ssh-keygen for host keys, ssh-agent for ansible-runner's ssh_key=
#   curl             the runbooks' Robot calls (their e2e runs them against the simulator)
#   tmux             a real terminal for the live `dev up` view's test (captures the pane twice)
#   gcc, libc6-dev   cgo for nvidia-mig-parted (hack/build-upstream.sh mp; go-nvml links -ldl)
#   gnupg            the stand-in publisher's signing key (capi_gpu_sim/aptsign) and apt_source's key checks
#
# openssh-server is deliberately NOT installed here: sshd runs from the guest root filesystem
# (debootstrap --include=openssh-server), so the test machine never gets a listener on 0.0.0.0:22.
#
# Idempotent: re-running installs nothing when everything is present. Needs root.
set -euo pipefail

PKGS=(debootstrap iproute2 util-linux mount openssh-client curl tmux gcc libc6-dev gnupg)

if [[ $(id -u) -ne 0 ]]; then
  echo "install-system-deps: needs root (apt-get)" >&2
  exit 2
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-system-deps: all present (${PKGS[*]})"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# Never let a package's postinst start a daemon on the test machine.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  created_policy=1
fi
trap '[[ $created_policy -eq 1 ]] && rm -f "$policy"' EXIT

apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-system-deps: installed ${missing[*]}"
