//! Any bytes as the file of `profilerd top` and `profilerd flamegraph`: a
//! one-line error or reports, never a panic.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use profilerd::report::{flamegraph, stacks, top};

fuzz_target!(|data: &[u8]| {
    let files = [PathBuf::from("cpu-20261124T000000Z.pb.gz")];
    match stacks::load_with(&files, None, |_| Ok(data.to_vec())) {
        Ok(s) => {
            for order in [top::Order::Flat, top::Order::Cum] {
                let _ = top::render(&s, order, 0);
                let _ = top::render(&s, order, 3);
            }
            let _ = flamegraph::render(&s);
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});
