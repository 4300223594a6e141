#!/usr/bin/env bash
# Regenerates the Python gRPC bindings of the kubelet's DRA v1 and plugin-registration v1 APIs, from the
# k8s.io/kubelet Go module at the pinned staging version, into capi_gpu/readiness/proto/.
#
#   hack/gen-protos.sh [OUT_ROOT]     # default: the repository root; files land in OUT_ROOT/capi_gpu/readiness/proto
#
# Why copy and rename instead of compiling in place: both upstream files are called api.proto, and Python's
# protobuf keeps one descriptor pool keyed by file name, so two "api.proto" would collide at import. The
# copies also get a package-qualified path, so the generated *_pb2_grpc.py imports its *_pb2 through the
# capi_gpu package. gogoproto options (older kubelet releases carry them) are stripped: protoc would need
# gogo.proto to parse them and they only steer Go code generation. The proto `package` lines stay as they
# are: they are the gRPC service names the kubelet dials (/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...).
#
# Output is deterministic for a given grpcio-tools; tests/unit/readiness/test_protos_regenerate.py fails
# when the committed files differ from a fresh run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
out_root=${1:-$root}
python=${PYTHON:-$root/.venv/bin/python}
pkg=capi_gpu/readiness/proto

command -v go >/dev/null 2>&1 || { echo "gen-protos: Go is needed to fetch k8s.io/kubelet; install Go >= 1.26." >&2; exit 2; }
moddir=$(GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "k8s.io/kubelet@$KUBERNETES_STAGING_VERSION" \
  | "$python" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/$pkg" "$out_root/$pkg"

clean() { # clean <upstream api.proto> <copy>: drop gogoproto import, file options and field options
  "$python" - "$1" "$2" "$KUBERNETES_STAGING_VERSION" <<'EOF'
import re, sys
src, dst, version = sys.argv[1:]
text = open(src, encoding="utf-8").read()
text = re.sub(r'^import\s+"github.com/gogo/protobuf/gogoproto/gogo.proto";\n', "", text, flags=re.M)
text = re.sub(r"^option\s+\(gogoproto\.[^)]*\)\s*=\s*[^;]*;\n", "", text, flags=re.M)
text = re.sub(r"\s*\[\s*\(gogoproto\.[^\]]*\]", "", text)
if "gogoproto" in text:
    sys.exit(f"gen-protos: gogoproto left in {src}; extend the cleaner")
header = f"// Copied from k8s.io/kubelet@{version} {src.split('@', 1)[1].split('/', 1)[1]} by hack/gen-protos.sh.\n"
open(dst, "w", encoding="utf-8").write(header + text)
EOF
}

clean "$moddir/pkg/apis/dra/v1/api.proto" "$work/$pkg/dra_v1.proto"
clean "$moddir/pkg/apis/pluginregistration/v1/api.proto" "$work/$pkg/pluginregistration_v1.proto"

"$python" -m grpc_tools.protoc -I "$work" --python_out="$out_root" --pyi_out="$out_root" \
  --grpc_python_out="$out_root" "$work/$pkg/dra_v1.proto" "$work/$pkg/pluginregistration_v1.proto"
cp "$work/$pkg/dra_v1.proto" "$work/$pkg/pluginregistration_v1.proto" "$out_root/$pkg/"
echo "gen-protos: wrote $(cd "$out_root/$pkg" && ls -- *_pb2*.py* *.proto | tr '\n' ' ')"
