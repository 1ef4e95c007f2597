#!/usr/bin/env bash
# Entrypoint of the hvdcomp images (docker/Dockerfile.cpu, docker/Dockerfile.cuda).
#
#   docker run IMAGE sshd [SSHD_ARGS...]    worker node: sshd in the foreground, nothing else
#   docker run -e HVDCOMP_SSHD=1 IMAGE CMD  launcher node: sshd in the background, then exec CMD
#   docker run IMAGE CMD                    just exec CMD (default: bash)
#
# SSH keys: every plain file in /root/.ssh_mounted (mount it read-only from the host) is copied
# into /root/.ssh with the permissions sshd insists on. Without an authorized_keys file among
# them, the mounted *.pub keys are authorised. Host keys are generated per container.
# SSH_PORT (default 12345) is the port sshd listens on and the one ssh connects to; if you change
# it at run time, also set OMPI_MCA_plm_rsh_args="-p $SSH_PORT".
set -euo pipefail

SSH_PORT="${SSH_PORT:-12345}"
MOUNTED=/root/.ssh_mounted
SSH_DIR=/root/.ssh

log() { echo "hvdcomp-entrypoint: $*" >&2; }

install_keys() {
  install -d -m 700 "$SSH_DIR"
  [ -d "$MOUNTED" ] || return 0
  local f
  for f in "$MOUNTED"/*; do
    [ -f "$f" ] && install -m 600 "$f" "$SSH_DIR/"
  done
  if [ ! -f "$MOUNTED/authorized_keys" ] && compgen -G "$MOUNTED/*.pub" >/dev/null; then
    cat "$MOUNTED"/*.pub >> "$SSH_DIR/authorized_keys"
    sort -u -o "$SSH_DIR/authorized_keys" "$SSH_DIR/authorized_keys"
    chmod 600 "$SSH_DIR/authorized_keys"
  fi
}

prepare_sshd() {
  mkdir -p /run/sshd
  ssh-keygen -A >/dev/null
  sed -i "s/^\([[:space:]]*\)Port .*/\1Port ${SSH_PORT}/" \
    /etc/ssh/sshd_config.d/hvdcomp.conf /etc/ssh/ssh_config.d/hvdcomp.conf
  # Commands started over ssh (mpirun's orted, horovodrun's task service) do not see the
  # container's environment; hand them the parts they need (PermitUserEnvironment is on).
  env | grep -E '^(PATH|LD_LIBRARY_PATH|PYTHONPATH|OMPI_[A-Za-z0-9_]+|NCCL_[A-Za-z0-9_]+|HOROVOD_[A-Za-z0-9_]+|HVDCOMP_[A-Za-z0-9_]+|CUDA_[A-Za-z0-9_]+)=' \
    > "$SSH_DIR/environment" || true
  chmod 600 "$SSH_DIR/environment"
  [ -s "$SSH_DIR/authorized_keys" ] || log "warning: no $SSH_DIR/authorized_keys; mount a key pair at $MOUNTED"
}

if [ "$(id -u)" -eq 0 ]; then
  install_keys
fi

if [ "${1:-}" = "sshd" ]; then
  shift
  prepare_sshd
  log "sshd in the foreground on port $SSH_PORT"
  exec /usr/sbin/sshd -D -e "$@"
fi

if [ "${HVDCOMP_SSHD:-0}" = "1" ]; then
  prepare_sshd
  /usr/sbin/sshd
  log "sshd started in the background on port $SSH_PORT"
fi

[ "$#" -gt 0 ] || set -- bash
exec "$@"
