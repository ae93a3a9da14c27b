#!/bin/sh
# The mrc-peers ConfigMap (deploy/kubernetes/mrc-daemonset.yaml) from a node
# list: one line per node, "NAME OVERLAY ETH1-ADDRESS ETH2-ADDRESS" (the
# plane devices as in mrc-config; '#' starts a comment). Prints YAML:
#
#   deploy/kubernetes/mrc-peers.sh nodes.txt | kubectl apply -f -
#
# NAME is the Kubernetes node name (the init container finds the node's own
# key by it). MRC_EVS_PER_PLANE (default 4) and MRC_NAMESPACE override.
set -eu
EVS=${MRC_EVS_PER_PLANE:-4}
echo "apiVersion: v1"
echo "kind: ConfigMap"
echo "metadata:"
echo "  name: mrc-peers"
echo "  namespace: ${MRC_NAMESPACE:-mrc-system}"
echo "data:"
grep -v '^[[:space:]]*\(#\|$\)' "${1:--}" | while read -r name overlay eth1 eth2; do
    if [ -z "$eth2" ]; then
        echo "mrc-peers.sh: line for '$name' needs NAME OVERLAY ETH1 ETH2" >&2
        exit 2
    fi
    echo "  $name.toml: |"
    echo "    overlay = \"$overlay\""
    echo "    evs_per_plane = $EVS"
    echo "    [underlay]"
    echo "    eth1 = \"$eth1\""
    echo "    eth2 = \"$eth2\""
done
