//! Compiles Pyroscope's push API (`proto/`, written from its published
//! `.proto` files) with protox and prost, for the stand-in server that
//! decodes what the daemon pushes. No `protoc` needed.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let fds = match protox::compile(["push/v1/push.proto"], ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("parsing proto/push/v1/push.proto: {e:?}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("generating Rust for the push API: {e}");
    }
}
