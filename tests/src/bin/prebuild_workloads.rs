//! `prebuild_workloads DIR`: builds every workload of `tests/workloads/`
//! that the tests may copy (`Workload::is_prebuilt`) into DIR under its
//! prebuilt name, as the tests build them, for machines
//! that run the tests without compilers (the kernel matrix's VMs, which
//! name DIR in `$PROFILERD_TEST_WORKLOADS`).

use std::path::PathBuf;
use std::process::ExitCode;

use profiler_tests::workloads::{PREBUILT_ENV, Workload};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: prebuild_workloads DIR");
        return ExitCode::from(2);
    };
    if std::env::var_os(PREBUILT_ENV).is_some() {
        eprintln!("prebuild_workloads: unset {PREBUILT_ENV}: it would copy, not build");
        return ExitCode::from(2);
    }
    let dir = PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("prebuild_workloads: creating {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for w in Workload::ALL.into_iter().filter(|w| w.is_prebuilt()) {
        // Workload::build panics with the compiler's output on failure.
        let exe = w.build(&dir, &w.prebuilt_name());
        println!("{}", exe.display());
    }
    ExitCode::SUCCESS
}
