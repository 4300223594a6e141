"""Generated gRPC bindings of the kubelet's DRA v1 and plugin-registration v1 APIs (hack/gen-protos.sh).

Committed so that the image and the tests need neither Go nor protoc; the ``.proto`` copies next to them
record exactly what was compiled, and a unit test fails when a fresh generation differs.
"""
