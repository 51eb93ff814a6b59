# Sourced by the NVMe/TCP study scripts (nvmf_peers.sh, nvmf_pacing_ab.sh,
# nvme_write_ab.sh): the one-reactor iopace config they serve a 1 GiB
# malloc bdev with, over NVMe/TCP on loopback only.
#
#   nvmf_config POLL RPC PORT [PACING_TOML] > FILE
#   POLL: the reactor's poll mode ("" for the default); RPC: the admin
#   socket path ("" for none); PACING_TOML: a [pacing] table, if any.
nvmf_config() {
  local poll=$1 rpc=$2 port=$3 pacing=${4:-}
  echo "[server]"
  echo "reactors = 1"
  [ -n "$poll" ] && echo "poll = \"$poll\""
  cat <<EOT
tcp = []
unix = []
rpc = "$rpc"
nvme_tcp = ["127.0.0.1:$port"]

[[bdev]]
name = "m0"
kind = "malloc"
size = "1GiB"

[[export]]
name = "default"
bdev = "m0"
EOT
  [ -n "$pacing" ] && printf '\n%s\n' "$pacing"
  return 0
}
