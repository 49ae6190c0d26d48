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
