//! Environment labels: workloads run in real cgroups named as docker,
//! containerd under Kubernetes and systemd name them, with the kubelet's and
//! the runtime's node files faked under a host root; every sample of each
//! workload, in every profile type, must carry exactly its container, pod,
//! service and node labels, and other processes none of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use profiler_tests::cgroups::{
    TestCgroups, V1SystemdHierarchy, in_cgroups_args, random_container_id, random_uuid, v2_mount,
};
use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::pprof_tool::check_readable;
use profiler_tests::process::run_with_timeout;
use profiler_tests::profiles::{FlatSample, ProfileFile, flatten_all, read_profiles, summary};
use profiler_tests::workloads::{Running, Workload};
use profiler_tests::{pause, temp_dir};

/// The labels the daemon takes from a process's environment.
const ENV_LABELS: [&str; 7] = [
    "container_id",
    "container",
    "pod",
    "namespace",
    "pod_uid",
    "systemd_unit",
    "node",
];
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(60);
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(15);

type Labels = BTreeMap<String, String>;

fn env_labels(s: &FlatSample) -> Labels {
    s.labels
        .iter()
        .filter(|(k, _)| ENV_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A faked node: the host root with the kubelet's and containerd's files,
/// and the node's name.
struct Node {
    root: PathBuf,
    name: String,
}

impl Node {
    fn new(dir: &Path) -> Node {
        let root = dir.join("host");
        std::fs::create_dir_all(&root).unwrap();
        let name = format!("test-node-{}", &random_uuid()[..8]);
        Node { root, name }
    }

    /// The kubelet's pod log directory with one container's directory, and
    /// its log link naming the container id.
    fn kubelet_files(&self, ns: &str, pod: &str, uid: &str, container: &str, id: &str) {
        let pod_dir = format!("/var/log/pods/{ns}_{pod}_{uid}/{container}");
        std::fs::create_dir_all(self.root.join(&pod_dir[1..])).unwrap();
        std::fs::write(self.root.join(&pod_dir[1..]).join("0.log"), "").unwrap();
        let links = self.root.join("var/log/containers");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            format!("{pod_dir}/0.log"),
            links.join(format!("{pod}_{ns}_{container}-{id}.log")),
        )
        .unwrap();
    }

    /// containerd's bundle of a CRI container (no kubelet files).
    fn containerd_bundle(&self, ns: &str, pod: &str, container: &str, id: &str) {
        let dir = self
            .root
            .join("run/containerd/io.containerd.runtime.v2.task/k8s.io")
            .join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            format!(
                r#"{{"ociVersion":"1.2.0","annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.container-name":"{container}","io.kubernetes.cri.sandbox-name":"{pod}","io.kubernetes.cri.sandbox-namespace":"{ns}"}}}}"#
            ),
        )
        .unwrap();
    }

    fn daemon(&self, args: &[String]) -> Daemon {
        let mut cmd = Command::new(profiler_tests::daemon::profilerd_bin());
        cmd.args(args)
            .env("PROFILERD_HOST_ROOT", &self.root)
            .env("NODE_NAME", &self.name);
        let mut daemon = Daemon::start_command(cmd);
        daemon.wait_ready();
        daemon
    }
}

/// One place a workload runs: the cgroups it is put in and the labels its
/// samples must carry.
struct Place {
    what: &'static str,
    procs: Vec<PathBuf>,
    want: Labels,
}

impl Place {
    fn start(&self, exe: &Path, args: &[&str]) -> Running {
        let procs: Vec<&Path> = self.procs.iter().map(PathBuf::as_path).collect();
        Running::start(Path::new("/bin/sh"), &in_cgroups_args(&procs, exe, args))
    }
}

/// A Kubernetes pod's container under the systemd driver (cgroup v2).
fn containerd_pod(cgroups: &mut TestCgroups, node: &Node) -> Place {
    let uid = random_uuid();
    let id = random_container_id();
    let rel = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
        uid.replace('-', "_")
    );
    let procs = cgroups.create(&v2_mount(), &rel);
    let pod = format!("shop-{}", &uid[..5]);
    node.kubelet_files("team-a", &pod, &uid, "cart", &id);
    Place {
        what: "containerd pod (systemd driver)",
        procs: vec![procs],
        want: labels(&[
            ("container_id", &id),
            ("container", "cart"),
            ("pod", &pod),
            ("namespace", "team-a"),
            ("pod_uid", &uid),
            ("node", &node.name),
        ]),
    }
}

/// A docker container under the systemd driver (cgroup v2).
fn docker_container(cgroups: &mut TestCgroups, node: &Node) -> Place {
    let id = random_container_id();
    let procs = cgroups.create(&v2_mount(), &format!("system.slice/docker-{id}.scope"));
    Place {
        what: "docker container",
        procs: vec![procs],
        want: labels(&[("container_id", &id), ("node", &node.name)]),
    }
}

/// A host service (cgroup v2).
fn service(cgroups: &mut TestCgroups, node: &Node) -> Place {
    let unit = format!("profilerd-test-{}.service", &random_uuid()[..8]);
    let procs = cgroups.create(&v2_mount(), &format!("system.slice/{unit}"));
    Place {
        what: "systemd service",
        procs: vec![procs],
        want: labels(&[("systemd_unit", &unit), ("node", &node.name)]),
    }
}

/// A pod's container under the cgroupfs driver in systemd's v1 hierarchy
/// mounted at `mount` (the process stays at the v2 root), named only by
/// containerd's bundle.
fn cgroupfs_v1_pod(cgroups: &mut TestCgroups, node: &Node, mount: &Path) -> Place {
    let uid = random_uuid();
    let id = random_container_id();
    let procs = cgroups.create(mount, &format!("kubepods/besteffort/pod{uid}/{id}"));
    let pod = format!("batch-{}", &uid[..5]);
    node.containerd_bundle("team-b", &pod, "worker", &id);
    Place {
        what: "containerd pod (cgroupfs driver, cgroup v1)",
        procs: vec![procs],
        want: labels(&[
            ("container_id", &id),
            ("container", "worker"),
            ("pod", &pod),
            ("namespace", "team-b"),
            ("pod_uid", &uid),
            ("node", &node.name),
        ]),
    }
}

/// Checks the samples of every file of `kind`: each sample of a pid in
/// `owners` has exactly its place's labels; every other sample has the node
/// label and none of the places' values. Returns the samples per place.
fn check_kind(
    out: &Path,
    kind: &str,
    owners: &BTreeMap<u32, &Place>,
    node: &Node,
    daemon: &Daemon,
) -> BTreeMap<&'static str, usize> {
    let files: Vec<ProfileFile> = read_profiles(out, kind);
    let samples = flatten_all(&files);
    let ours: BTreeSet<&str> = owners
        .values()
        .flat_map(|p| p.want.iter())
        .filter(|(k, _)| k.as_str() != "node")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut per_place = BTreeMap::new();
    for s in &samples {
        let got = env_labels(s);
        match owners.get(&s.pid()) {
            Some(place) => {
                assert_eq!(
                    got,
                    place.want,
                    "{kind} sample of pid {} in the {}: labels {:?}\n{}",
                    s.pid(),
                    place.what,
                    s.labels,
                    daemon.describe()
                );
                *per_place.entry(place.what).or_insert(0) += 1;
            }
            None => {
                assert_eq!(
                    got.get("node").map(String::as_str),
                    Some(node.name.as_str()),
                    "{kind} sample of another process without the node label: {:?}",
                    s.labels
                );
                let leaked: Vec<&String> =
                    got.values().filter(|v| ours.contains(v.as_str())).collect();
                assert!(
                    leaked.is_empty(),
                    "{kind} sample of another process (pid {}) has a test workload's labels {leaked:?}: {:?}",
                    s.pid(),
                    s.labels
                );
            }
        }
    }
    // The reference reader sees the labels too.
    let mut places: Vec<&Place> = owners.values().copied().collect();
    places.sort_by_key(|p| p.what);
    places.dedup_by_key(|p| p.what);
    for place in places {
        let Some(file) = files.iter().find(|f| {
            flatten_all(std::slice::from_ref(f))
                .iter()
                .any(|s| owners.get(&s.pid()).is_some_and(|p| p.what == place.what))
        }) else {
            continue;
        };
        let raw = check_readable(&file.path, true);
        for (k, v) in &place.want {
            assert!(
                raw.contains(&format!("{k}:[{v}]")),
                "`go tool pprof -raw {}` does not show {k}:[{v}] of the {}:\n{raw}",
                file.path.display(),
                place.what
            );
        }
    }
    if per_place.is_empty() {
        eprintln!("{kind}: no samples of the workloads\n{}", summary(&samples));
    }
    per_place
}

/// System-wide, all five profile types: a CPU burner in each place, and in
/// the pod also an allocating and a lock-contending workload.
#[test]
fn system_wide_every_profile_type_carries_the_environment() {
    require_root();
    let tmp = temp_dir();
    let node = Node::new(tmp.path());
    // Unmounted (if the test mounted it) after the cgroups made in it go.
    let v1 = V1SystemdHierarchy::find_or_mount();
    // Dropped last: after the workloads are killed.
    let mut cgroups = TestCgroups::new();
    let pod = containerd_pod(&mut cgroups, &node);
    let docker = docker_container(&mut cgroups, &node);
    let unit = service(&mut cgroups, &node);
    let v1_pod = match &v1 {
        Ok(hierarchy) => Some(cgroupfs_v1_pod(&mut cgroups, &node, &hierarchy.mount)),
        Err(why) => {
            eprintln!("NOT RUN: the cgroupfs v1 case: {why}");
            None
        }
    };

    let burner = Workload::CpuRatioC.build(tmp.path(), "env_burner");
    let heap = Workload::HeapSites.build(tmp.path(), "env_heap");
    let mutex = Workload::MutexHold.build(tmp.path(), "env_mutex");
    let out = tmp.path().join("out");

    let mut places: Vec<&Place> = vec![&pod, &docker, &unit];
    places.extend(v1_pod.as_ref());
    let mut workloads: Vec<(Running, &Place)> = Vec::new();
    for place in &places {
        workloads.push((place.start(&burner, &["3", "--wait-stdin"]), place));
    }
    let mut heap_run = pod.start(&heap, &["--wait-stdin"]);
    heap_run.wait_line(Duration::from_secs(10), |l| l.starts_with("ready "));
    let mut mutex_run = pod.start(&mutex, &["--wait-stdin", "--iterations", "300"]);
    mutex_run.wait_line(Duration::from_secs(10), |l| l.starts_with("ready "));
    // A process in none of the test's cgroups.
    let mut control = Running::start(&burner, &["3", "--wait-stdin"]);

    // One contended wake-up in 10 is kept: the ~300 of the mutex
    // workload give ~30 (at the default 1 in 100, ~3, and none in about
    // one run in 20).
    let args: Vec<String> = [
        "--profiles",
        "cpu,heap,block,mutex,offcpu",
        "--mutex-fraction",
        "10",
        "--interval",
        "60s",
        "--duration",
        "40s",
        "--output-dir",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut daemon = node.daemon(&args);
    for (run, _) in &mut workloads {
        run.release();
    }
    heap_run.release();
    mutex_run.release();
    control.release();
    for (run, _) in &mut workloads {
        run.finish(WORKLOAD_TIMEOUT);
    }
    heap_run.finish(WORKLOAD_TIMEOUT);
    mutex_run.finish(WORKLOAD_TIMEOUT);
    control.finish(WORKLOAD_TIMEOUT);
    daemon.signal(libc::SIGINT);
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);

    let mut owners: BTreeMap<u32, &Place> = workloads
        .iter()
        .map(|(run, place)| (run.pid(), *place))
        .collect();
    owners.insert(heap_run.pid(), &pod);
    owners.insert(mutex_run.pid(), &pod);
    let mut counts = BTreeMap::new();
    for kind in ["cpu", "heap", "block", "mutex", "offcpu"] {
        counts.insert(kind, check_kind(&out, kind, &owners, &node, &daemon));
    }
    eprintln!("samples checked per profile type and place: {counts:?}");
    // Every place has CPU samples; the pod has samples of every type.
    for place in &places {
        assert!(
            counts["cpu"].get(place.what).is_some_and(|n| *n > 0),
            "no cpu samples of the burner in the {}: {counts:?}\n{}",
            place.what,
            daemon.describe()
        );
    }
    for kind in ["heap", "block", "mutex", "offcpu"] {
        assert!(
            counts[kind].get(pod.what).is_some_and(|n| *n > 0),
            "no {kind} samples of the pod's workloads: {counts:?}\n{}",
            daemon.describe()
        );
    }
    // The control burner's samples carry the node and nothing of ours
    // (checked above); it must have been sampled.
    let control_samples = flatten_all(&read_profiles(&out, "cpu"))
        .into_iter()
        .filter(|s| s.pid() == control.pid())
        .count();
    assert!(control_samples > 0, "the control burner was not sampled");
}

/// `--pid` of workloads in two places: their samples carry their labels.
#[test]
fn pid_mode_carries_the_environment() {
    require_root();
    let tmp = temp_dir();
    let node = Node::new(tmp.path());
    let mut cgroups = TestCgroups::new();
    let pod = containerd_pod(&mut cgroups, &node);
    let unit = service(&mut cgroups, &node);
    let burner = Workload::CpuRatioC.build(tmp.path(), "env_pid_burner");
    let out = tmp.path().join("out");
    let mut in_pod = pod.start(&burner, &["3", "--wait-stdin"]);
    let mut in_unit = unit.start(&burner, &["3", "--wait-stdin"]);
    // The shells must have exec'd the burner (it then waits on stdin).
    pause(Duration::from_millis(300));
    let pids = format!("{},{}", in_pod.pid(), in_unit.pid());
    let args: Vec<String> = [
        "--pid",
        &pids,
        "--profiles",
        "cpu,offcpu",
        "--interval",
        "60s",
        "--output-dir",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut daemon = node.daemon(&args);
    in_pod.release();
    in_unit.release();
    in_pod.finish(WORKLOAD_TIMEOUT);
    in_unit.finish(WORKLOAD_TIMEOUT);
    in_pod.kill();
    in_unit.kill();
    // Its targets gone, the daemon writes the last window and exits.
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let owners: BTreeMap<u32, &Place> =
        BTreeMap::from([(in_pod.pid(), &pod), (in_unit.pid(), &unit)]);
    let cpu = check_kind(&out, "cpu", &owners, &node, &daemon);
    check_kind(&out, "offcpu", &owners, &node, &daemon);
    for place in [&pod, &unit] {
        assert!(
            cpu.get(place.what).is_some_and(|n| *n > 0),
            "no cpu samples in the {}: {cpu:?}\n{}",
            place.what,
            daemon.describe()
        );
    }
}

/// A process seen outside any container that then enters one and execs:
/// its labels are read again at the exec. Labels, like `comm`, are those of
/// the process when its window closes; the thread label is taken with each
/// sample, so it tells the shell's samples from the burner's.
#[test]
fn labels_are_read_again_at_exec() {
    require_root();
    let tmp = temp_dir();
    let node = Node::new(tmp.path());
    let mut cgroups = TestCgroups::new();
    let docker = docker_container(&mut cgroups, &node);
    let burner = Workload::CpuRatioC.build(tmp.path(), "env_exec_burner");
    let out = tmp.path().join("out");
    // Burn in the shell (builtins only) for about 3 s outside, then enter
    // and exec.
    let script = r#"read go; read t0 _ < /proc/uptime; t0=${t0%.*}
while :; do read t _ < /proc/uptime; [ $(( ${t%.*} - t0 )) -ge 3 ] && break; done
echo $$ > "$1" && exec "$2" 2"#;
    let procs = docker.procs[0].display().to_string();
    let mut run = Running::start(
        Path::new("/bin/sh"),
        &["-c", script, "sh", procs.as_str(), burner.to_str().unwrap()],
    );
    let pid = run.pid().to_string();
    let args: Vec<String> = [
        "--pid",
        &pid,
        "--interval",
        "1s",
        "--output-dir",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut daemon = node.daemon(&args);
    run.release();
    run.finish(WORKLOAD_TIMEOUT);
    run.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);

    let files = read_profiles(&out, "cpu");
    let samples = flatten_all(&files);
    let bare = labels(&[("node", &node.name)]);
    let before: Vec<&FlatSample> = samples
        .iter()
        .filter(|s| s.label("thread") != Some("env_exec_burner"))
        .collect();
    let after: Vec<&FlatSample> = samples
        .iter()
        .filter(|s| s.label("thread") == Some("env_exec_burner"))
        .collect();
    let d = || format!("{}\n{}", summary(&samples), daemon.describe());
    assert!(!after.is_empty(), "no samples after the exec\n{}", d());
    for s in &after {
        assert_eq!(env_labels(s), docker.want, "after the exec: {:?}", s.labels);
    }
    // Windows that closed before the exec show the shell outside.
    let outside = before.iter().filter(|s| env_labels(s) == bare).count();
    assert!(
        outside > 0,
        "no sample of the shell without container labels before the exec ({} shell samples)\n{}",
        before.len(),
        d()
    );
    for s in &before {
        let got = env_labels(s);
        assert!(
            got == bare || got == docker.want,
            "shell sample with other labels: {:?}",
            s.labels
        );
    }
}

/// The environment labels' names are the daemon's: a `--label` with one is
/// refused with exit status 2 before anything is written.
#[test]
fn environment_label_names_are_reserved() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    for name in &ENV_LABELS {
        let mut cmd = Command::new(profiler_tests::daemon::profilerd_bin());
        cmd.args(["--label", &format!("{name}=x"), "--output-dir"])
            .arg(&out);
        let output = run_with_timeout(cmd, "profilerd --label", Duration::from_secs(10));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "--label {name}=x: {}\n{stderr}",
            output.status
        );
        assert!(
            stderr.contains(&format!("'{name}'")) && stderr.contains("reserved"),
            "--label {name}=x: the error must name the label:\n{stderr}"
        );
        assert!(!out.exists(), "nothing may be written on bad input");
    }
}
