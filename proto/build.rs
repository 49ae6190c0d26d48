//! Compiles `profile.proto` into Rust with protox (a pure-Rust protobuf
//! parser), so building needs no `protoc` on the machine.

fn main() {
    println!("cargo:rerun-if-changed=profile.proto");
    // A build script reports failure by panicking; the message names the cause.
    let fds = match protox::compile(["profile.proto"], ["."]) {
        Ok(fds) => fds,
        Err(e) => panic!("parsing profile.proto: {e:?}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("generating Rust for profile.proto: {e}");
    }
}
