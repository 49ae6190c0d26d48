//! Compiles the published APIs the stand-in servers decode requests with
//! (`proto/`, written from the published `.proto` files): Pyroscope's push
//! API, and OpenTelemetry's profiles signal with google.rpc.Status, with
//! protox and prost. No `protoc` needed.

const PROTOS: [&str; 3] = [
    "push/v1/push.proto",
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
    "google/rpc/status.proto",
];

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let fds = match protox::compile(PROTOS, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("parsing proto/: {e:?}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("generating Rust for proto/: {e}");
    }
}
