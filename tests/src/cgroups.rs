//! Cgroups made by a test: created in the real hierarchies (cgroup v2, and
//! systemd's named v1 hierarchy, the host's or one the test mounts),
//! workloads placed in
//! them before they run, and everything undone when the guard is dropped,
//! also while a failed assertion unwinds: the test's own processes still in
//! them are moved back to the test's cgroup and every directory created is
//! removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::wait_until;

/// How long removing a cgroup may wait for a killed process to leave it.
const RMDIR_TIMEOUT: Duration = Duration::from_secs(5);

/// Mount points of cgroup filesystems, from /proc/self/mountinfo: the first
/// whose type is `fstype` and whose super options satisfy `opts`.
fn find_mount(fstype: &str, opts: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mount_point = left.split_whitespace().nth(4)?;
        let mut right = right.split_whitespace();
        let (fs, _source, super_opts) = (right.next()?, right.next()?, right.next()?);
        (fs == fstype && opts(super_opts)).then(|| PathBuf::from(mount_point))
    })
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid host).
pub fn v2_mount() -> PathBuf {
    find_mount("cgroup2", |_| true).expect("no cgroup2 filesystem is mounted")
}

/// Where systemd's named v1 hierarchy (`name=systemd`) is mounted, if the
/// host has one (hybrid and legacy hosts).
pub fn v1_systemd_mount() -> Option<PathBuf> {
    find_mount("cgroup", |opts| {
        opts.split(',').any(|o| o == "name=systemd")
    })
}

/// Where the v1 memory controller is mounted, if the host has one (hybrid
/// and legacy hosts, where cgroup2 carries no controllers).
pub fn v1_memory_mount() -> Option<PathBuf> {
    find_mount("cgroup", |opts| opts.split(',').any(|o| o == "memory"))
}

/// A random lower-case UUID, from the kernel.
pub fn random_uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .expect("reading /proc/sys/kernel/random/uuid")
        .trim()
        .to_string()
}

/// A random 64-hex-digit id, as container runtimes name containers.
pub fn random_container_id() -> String {
    format!("{}{}", random_uuid(), random_uuid()).replace('-', "")
}

/// systemd's named v1 hierarchy, the host's or one mounted for the test: a
/// host on cgroup v2 alone still lets a named hierarchy with no controllers
/// be mounted beside it, as hybrid hosts have it. One mounted here is
/// unmounted when this is dropped, so drop it after the [`TestCgroups`]
/// made in it (declare it first).
pub struct V1SystemdHierarchy {
    pub mount: PathBuf,
    ours: bool,
}

impl V1SystemdHierarchy {
    /// The host's, else one mounted now; why not, if neither.
    pub fn find_or_mount() -> Result<Self, String> {
        if let Some(mount) = v1_systemd_mount() {
            return Ok(Self { mount, ours: false });
        }
        let dir = std::env::temp_dir().join(format!(
            "profilerd-test-v1-systemd-{}-{}",
            std::process::id(),
            &random_uuid()[..8]
        ));
        std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "cgroup", "-o", "none,name=systemd", "cgroup"])
            .arg(&dir)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Ok(Self {
                mount: dir,
                ours: true,
            }),
            other => {
                let _ = std::fs::remove_dir(&dir);
                Err(match other {
                    Ok(out) => format!(
                        "mounting a name=systemd cgroup v1 hierarchy failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                    Err(e) => format!("running mount: {e}"),
                })
            }
        }
    }
}

impl Drop for V1SystemdHierarchy {
    fn drop(&mut self) {
        if self.ours {
            match std::process::Command::new("umount")
                .arg(&self.mount)
                .status()
            {
                Ok(status) if status.success() => {
                    let _ = std::fs::remove_dir(&self.mount);
                }
                _ => eprintln!("could not unmount {}", self.mount.display()),
            }
        }
    }
}

/// The cgroup of this process in the hierarchy mounted at `mount`.
fn own_cgroup(mount: &Path) -> PathBuf {
    let v2 = mount == v2_mount();
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("reading /proc/self/cgroup");
    let path = text
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (hierarchy, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let ours = if v2 {
                hierarchy == "0" && controllers.is_empty()
            } else {
                controllers.split(',').any(|c| c == "name=systemd")
            };
            ours.then(|| path.trim_start_matches('/').to_string())
        })
        .unwrap_or_default();
    mount.join(path)
}

/// The cgroups one test made. Drop it after the workloads in them (declare
/// it first): it moves any process still inside back and removes them.
#[derive(Default)]
pub struct TestCgroups {
    /// (hierarchy mount, directory), in creation order.
    created: Vec<(PathBuf, PathBuf)>,
}

impl TestCgroups {
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates the cgroup `relative` (and its missing ancestors) in the
    /// hierarchy mounted at `mount`; returns its `cgroup.procs` file.
    /// Directories that already exist are used and left in place.
    pub fn create(&mut self, mount: &Path, relative: &str) -> PathBuf {
        let mut dir = mount.to_path_buf();
        for part in relative.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            match std::fs::create_dir(&dir) {
                Ok(()) => self.created.push((mount.to_path_buf(), dir.clone())),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("creating the cgroup {}: {e}", dir.display()),
            }
        }
        dir.join("cgroup.procs")
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for (mount, dir) in self.created.iter().rev() {
            let home = own_cgroup(mount).join("cgroup.procs");
            // Only processes this test put here (the directories are new):
            // a workload not yet reaped or one it forked.
            let pids = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in pids.lines() {
                if let Err(e) = std::fs::write(&home, pid) {
                    eprintln!(
                        "moving {pid} out of {} to {}: {e}",
                        dir.display(),
                        home.display()
                    );
                }
            }
            let removed = wait_until(RMDIR_TIMEOUT, || match std::fs::remove_dir(dir) {
                Ok(()) => true,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            });
            if !removed {
                eprintln!("could not remove the test cgroup {}", dir.display());
            }
        }
    }
}

/// The arguments that run `exe ARGS` through `/bin/sh` after the shell put
/// itself into every cgroup whose `cgroup.procs` file is given: the
/// workload is in its cgroups from its first instruction. The shell execs
/// the workload, so the pid stays the same.
pub fn in_cgroups_args(procs: &[&Path], exe: &Path, args: &[&str]) -> Vec<String> {
    let script =
        r#"while [ "$1" != "--" ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@""#;
    let mut all = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
    all.extend(procs.iter().map(|p| p.display().to_string()));
    all.push("--".to_string());
    all.push(exe.display().to_string());
    all.extend(args.iter().map(|a| a.to_string()));
    all
}

/// `256M` (systemd) or `256Mi` (Kubernetes) in bytes; both are binary.
pub fn bytes_of(text: &str) -> u64 {
    let text = text.trim().trim_matches('"');
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let number: u64 = digits
        .parse()
        .unwrap_or_else(|_| panic!("{text:?} is not a memory size"));
    let shift = match &text[digits.len()..] {
        "" => 0,
        "K" | "Ki" => 10,
        "M" | "Mi" => 20,
        "G" | "Gi" => 30,
        unit => panic!("{text:?}: unknown unit {unit:?}"),
    };
    number << shift
}

/// A memory cgroup made for the test: cgroup v2's memory controller where
/// the host enables it, else v1's (hybrid hosts).
pub enum MemoryCgroup {
    V2(PathBuf),
    V1(PathBuf),
}

/// What the cgroup recorded of a run.
pub struct MemoryRecord {
    pub oom_kills: u64,
    /// Times usage reached the limit (and reclaim ran).
    pub limit_hits: u64,
    pub peak: Option<u64>,
    pub anon: u64,
    pub file: u64,
}

impl MemoryCgroup {
    /// Creates the cgroup with `limit` bytes and no swap; returns it and
    /// its `cgroup.procs`.
    pub fn create(cgroups: &mut TestCgroups, limit: u64) -> (MemoryCgroup, PathBuf) {
        let name = format!("profilerd-e2e-memory-{}", random_uuid());
        let v2 = v2_mount();
        let v2_memory = std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "memory");
        let (cgroup, procs) = if v2_memory {
            let procs = cgroups.create(&v2, &name);
            let dir: PathBuf = procs
                .parent()
                .expect("cgroup.procs is in its cgroup")
                .into();
            std::fs::write(dir.join("memory.max"), limit.to_string()).expect("setting memory.max");
            // Swap would hide an overrun; not every kernel has the file.
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            (MemoryCgroup::V2(dir), procs)
        } else {
            let mount = v1_memory_mount().unwrap_or_else(|| {
                panic!(
                    "no memory controller: not enabled under {} and no v1 hierarchy",
                    v2.display()
                )
            });
            let procs = cgroups.create(&mount, &name);
            let dir: PathBuf = procs
                .parent()
                .expect("cgroup.procs is in its cgroup")
                .into();
            std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())
                .expect("setting memory.limit_in_bytes");
            // Memory plus swap at the same limit: no swap (absent without
            // swap accounting).
            let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
            (MemoryCgroup::V1(dir), procs)
        };
        (cgroup, procs)
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        match self {
            MemoryCgroup::V2(dir) | MemoryCgroup::V1(dir) => dir,
        }
    }

    pub fn record(&self) -> MemoryRecord {
        match self {
            MemoryCgroup::V2(dir) => MemoryRecord {
                oom_kills: keyed(dir, "memory.events", "oom_kill "),
                limit_hits: keyed(dir, "memory.events", "max "),
                peak: read_number(&dir.join("memory.peak")),
                anon: keyed(dir, "memory.stat", "anon "),
                file: keyed(dir, "memory.stat", "file "),
            },
            MemoryCgroup::V1(dir) => MemoryRecord {
                oom_kills: keyed(dir, "memory.oom_control", "oom_kill "),
                limit_hits: read_number(&dir.join("memory.failcnt")).unwrap_or(0),
                peak: read_number(&dir.join("memory.max_usage_in_bytes")),
                anon: keyed(dir, "memory.stat", "rss "),
                file: keyed(dir, "memory.stat", "cache "),
            },
        }
    }
}

/// A number from a cgroup's flat-keyed file (`memory.events`), 0 when
/// absent.
pub fn keyed(dir: &Path, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or(0)
}

pub fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A CPU cgroup made for the test with a quota of `percent` of one CPU per
/// 100 ms period (systemd's CPUQuota= and default period): cgroup v2's cpu
/// controller where the host enables it, else v1's (hybrid hosts).
pub struct CpuCgroup {
    pub dir: PathBuf,
    v2: bool,
}

impl CpuCgroup {
    /// Creates the cgroup; returns it and its `cgroup.procs`.
    pub fn create(cgroups: &mut TestCgroups, percent: u64) -> (CpuCgroup, PathBuf) {
        const PERIOD_US: u64 = 100_000;
        let quota_us = PERIOD_US * percent / 100;
        let name = format!("profilerd-e2e-cpu-{}", random_uuid());
        let v2 = v2_mount();
        let v2_cpu = std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "cpu");
        let mount = if v2_cpu {
            v2
        } else {
            v1_cpu_mount().unwrap_or_else(|| {
                panic!(
                    "no cpu controller: not enabled under {} and no v1 hierarchy",
                    v2.display()
                )
            })
        };
        let procs = cgroups.create(&mount, &name);
        let dir: PathBuf = procs
            .parent()
            .expect("cgroup.procs is in its cgroup")
            .into();
        if v2_cpu {
            std::fs::write(dir.join("cpu.max"), format!("{quota_us} {PERIOD_US}"))
                .expect("setting cpu.max");
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
                .expect("setting cpu.cfs_period_us");
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string())
                .expect("setting cpu.cfs_quota_us");
        }
        (CpuCgroup { dir, v2: v2_cpu }, procs)
    }

    /// (periods, throttled periods, throttled time in ms) from `cpu.stat`.
    pub fn throttling(&self) -> (u64, u64, u64) {
        let throttled_ms = if self.v2 {
            keyed(&self.dir, "cpu.stat", "throttled_usec ") / 1000
        } else {
            keyed(&self.dir, "cpu.stat", "throttled_time ") / 1_000_000
        };
        (
            keyed(&self.dir, "cpu.stat", "nr_periods "),
            keyed(&self.dir, "cpu.stat", "nr_throttled "),
            throttled_ms,
        )
    }
}

/// Where the v1 cpu controller is mounted, if the host has one.
pub fn v1_cpu_mount() -> Option<PathBuf> {
    find_mount("cgroup", |opts| opts.split(',').any(|o| o == "cpu"))
}
