//! Labels that say where a process runs: its container, Kubernetes pod and
//! systemd service, and the node. This module owns parsing the process's
//! cgroup path and reading the node's own files for the pod and container
//! names (no API server is asked).
//!
//! Sources, and why:
//! - `container_id`, `pod_uid`, `systemd_unit`: the cgroup path, which every
//!   runtime and systemd name after what they run (docker, containerd,
//!   cri-o, podman; systemd and cgroupfs drivers; cgroup v2 and v1).
//! - `namespace`, `pod`: the kubelet's pod log directory
//!   `/var/log/pods/<namespace>_<pod>_<uid>/`, created by the kubelet for
//!   every pod whatever the runtime; found by the uid from the cgroup path.
//! - `container`: the kubelet's log link
//!   `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`, created
//!   for every container and the one node file that joins a container id
//!   to its name. If it is missing, the runtime's own state: containerd's
//!   OCI bundle (`/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/
//!   config.json`) or cri-o's (`/run/containers/storage/overlay-containers/
//!   <id>/userdata/config.json`), whose annotations name the container, pod
//!   and namespace.
//! - `node`: `$NODE_NAME` (the DaemonSet sets it from the downward API),
//!   else the host name.
//!
//! Node paths are read under `$PROFILERD_HOST_ROOT` (default `/`), so a
//! container that mounts the host's directories elsewhere can point at them.
//! Names are DNS labels (no `_`), so the `_`-joined file names split
//! unambiguously. Lookups are cached by pod uid and container id, bounded;
//! a miss is retried after a while, as the kubelet may write the files just
//! after the process starts.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use procfs::ProcessCGroup;
use tracing::debug;

/// The labels this module sets, in the order they are added to a sample.
pub const LABELS: [&str; 7] = [
    "container_id",
    "container",
    "pod",
    "namespace",
    "pod_uid",
    "systemd_unit",
    "node",
];

/// Environment variable that prefixes the node paths read here.
pub const HOST_ROOT_ENV: &str = "PROFILERD_HOST_ROOT";
/// Environment variable with the Kubernetes node name.
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// Entries per lookup cache; a full cache is emptied (and counted).
const CACHE_SIZE: usize = 4096;
/// How long a failed lookup is remembered before the files are read again.
const MISS_TTL: Duration = Duration::from_secs(10);
/// Largest runtime state file read (an OCI config.json is tens of KiB).
const MAX_STATE_FILE: u64 = 4 << 20;
/// Prefixes of a container's cgroup name (before the id; `.scope` after it
/// under the systemd driver). Conmon's scopes (`crio-conmon-<id>.scope`,
/// `libpod-conmon-<id>.scope`) are the runtime's monitor, not the
/// container, and are deliberately not matched.
const CONTAINER_PREFIXES: [&str; 6] = [
    "docker-",
    "cri-containerd-",
    "crio-",
    "libpod-",
    "nerdctl-",
    "",
];

/// What a cgroup path says about a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupFacts {
    /// Full 64-hex id of the innermost container.
    pub container_id: Option<String>,
    /// Kubernetes pod uid, with dashes as the API writes it.
    pub pod_uid: Option<String>,
    /// Innermost systemd service unit (`foo.service`).
    pub systemd_unit: Option<String>,
}

impl CgroupFacts {
    fn is_empty(&self) -> bool {
        self.container_id.is_none() && self.pod_uid.is_none() && self.systemd_unit.is_none()
    }
}

/// Parses one cgroup path (as in /proc/PID/cgroup). Each fact is taken from
/// the innermost segment that gives it: a container nested in a container
/// (kind, docker-in-docker) is named by the inner one, which is the one its
/// pod and runtime know.
///
/// `systemd_unit` is the innermost `.service` unit: a host service
/// (`/system.slice/nginx.service`), a user service
/// (`.../user@1000.service/app.slice/x.service`) or the user manager itself.
/// Scopes (login sessions, containers, `systemd-run --scope`) and slices are
/// not services: their names are transient or mere groupings, and a
/// container already has `container_id`.
pub fn parse_cgroup_path(path: &str) -> CgroupFacts {
    let mut facts = CgroupFacts::default();
    let mut segments = path.split('/').filter(|s| !s.is_empty()).peekable();
    // A path relative to the reader's cgroup namespace starts with "..": the
    // `kubepods` ancestor may be above the namespace root.
    let mut in_kubepods = segments.peek() == Some(&"..");
    for segment in segments {
        if segment == "kubepods" || segment.starts_with("kubepods.") {
            in_kubepods = true;
        }
        if let Some(uid) = pod_uid_of(segment, in_kubepods) {
            facts.pod_uid = Some(uid);
        }
        if let Some(id) = container_id_of(segment) {
            facts.container_id = Some(id);
        }
        if segment.len() > ".service".len() && segment.ends_with(".service") {
            facts.systemd_unit = Some(segment.to_owned());
        }
    }
    facts
}

/// The facts of a process from all its cgroup lines, trying the v2
/// hierarchy first, then systemd's v1 hierarchy, then the v1 controllers (a
/// v1-only host, or a runtime using the cgroupfs driver on a hybrid host,
/// places containers only there): the first line that names a container or
/// pod, else the first that names anything. A container's processes can
/// stay in the runtime's service in one hierarchy while the other names the
/// container.
pub fn facts_from_cgroups(cgroups: &[ProcessCGroup]) -> CgroupFacts {
    let rank = |cg: &ProcessCGroup| {
        if cg.hierarchy == 0 && cg.controllers.is_empty() {
            0
        } else if cg.controllers.iter().any(|c| c == "name=systemd") {
            1
        } else {
            2
        }
    };
    let mut ordered: Vec<&ProcessCGroup> = cgroups.iter().collect();
    ordered.sort_by_key(|cg| rank(cg));
    let parsed: Vec<CgroupFacts> = ordered
        .into_iter()
        .map(|cg| parse_cgroup_path(&cg.pathname))
        .collect();
    let names_workload = |f: &&CgroupFacts| f.container_id.is_some() || f.pod_uid.is_some();
    parsed
        .iter()
        .find(names_workload)
        .or_else(|| parsed.iter().find(|f| !f.is_empty()))
        .cloned()
        .unwrap_or_default()
}

/// `kubepods-burstable-pod<uid with _>.slice`, `kubepods-pod<uid>.slice`
/// (systemd driver) or `pod<uid>` under `kubepods` (cgroupfs driver).
fn pod_uid_of(segment: &str, in_kubepods: bool) -> Option<String> {
    let raw = if let Some(slice) = segment
        .strip_prefix("kubepods-")
        .and_then(|s| s.strip_suffix(".slice"))
    {
        // The uid has `_` for `-` (a `-` separates slice levels).
        slice.rsplit('-').next()?.strip_prefix("pod")?
    } else if in_kubepods {
        segment.strip_prefix("pod")?
    } else {
        return None;
    };
    let uid = raw.replace('_', "-");
    is_pod_uid(&uid).then_some(uid)
}

/// A UUID (8-4-4-4-12 hex), or the 32 hex digits the kubelet gives static
/// pods (a hash of their manifest).
fn is_pod_uid(uid: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if uid.len() == 32 {
        return hex(uid);
    }
    let groups: Vec<&str> = uid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && hex(g))
}

/// `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope` (systemd driver), `crio-<id>`, `libpod-<id>` or a
/// bare `<id>` (cgroupfs driver: `/docker/<id>`, `/kubepods/.../<id>`).
fn container_id_of(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    CONTAINER_PREFIXES
        .iter()
        .filter_map(|prefix| name.strip_prefix(prefix))
        .find(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|id| id.to_ascii_lowercase())
}

/// What the node's files say about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodNames {
    namespace: String,
    pod: String,
}

/// What the node's files say about a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ContainerNames {
    container: Option<String>,
    pod: Option<String>,
    namespace: Option<String>,
}

/// A bounded map from a key to a lookup's result; a miss expires.
#[derive(Debug)]
struct LookupCache<V> {
    entries: HashMap<String, (Instant, Option<V>)>,
    drops: u64,
}

impl<V: Clone> LookupCache<V> {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
            drops: 0,
        }
    }

    fn get_or_load(&mut self, key: &str, load: impl FnOnce() -> Option<V>) -> Option<V> {
        if let Some((at, value)) = self.entries.get(key)
            && (value.is_some() || at.elapsed() < MISS_TTL)
        {
            return value.clone();
        }
        let value = load();
        if self.entries.len() >= CACHE_SIZE && !self.entries.contains_key(key) {
            self.drops += self.entries.len() as u64;
            debug!(
                entries = self.entries.len(),
                "label lookup cache full, emptied"
            );
            self.entries.clear();
        }
        self.entries
            .insert(key.to_owned(), (Instant::now(), value.clone()));
        value
    }
}

/// Resolves the environment labels of processes; holds the node name, the
/// host root and the lookup caches.
#[derive(Debug)]
pub struct Environment {
    host_root: PathBuf,
    node: Option<String>,
    pods: LookupCache<PodNames>,
    containers: LookupCache<ContainerNames>,
}

impl Environment {
    /// From `$PROFILERD_HOST_ROOT` and `$NODE_NAME` (else the host name).
    pub fn from_env() -> Self {
        let root = std::env::var_os(HOST_ROOT_ENV)
            .filter(|r| !r.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        let node = std::env::var(NODE_NAME_ENV)
            .ok()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .or_else(host_name);
        debug!(host_root = %root.display(), ?node, "environment labels");
        Self::new(root, node)
    }

    pub fn new(host_root: PathBuf, node: Option<String>) -> Self {
        Self {
            host_root,
            node,
            pods: LookupCache::new(),
            containers: LookupCache::new(),
        }
    }

    /// The node label, if known.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Cache entries dropped because a cache was full.
    pub fn cache_drops(&self) -> u64 {
        self.pods.drops + self.containers.drops
    }

    /// The labels of a process in these cgroups, in [`LABELS`] order, only
    /// those known. The node label is not included (see [`Self::node`]).
    pub fn labels(&mut self, cgroups: &[ProcessCGroup]) -> Vec<(&'static str, String)> {
        let facts = facts_from_cgroups(cgroups);
        let pod = facts.pod_uid.as_deref().and_then(|uid| {
            let root = &self.host_root;
            self.pods.get_or_load(uid, || pod_from_log_dir(root, uid))
        });
        let container = facts.container_id.as_deref().and_then(|id| {
            let root = &self.host_root;
            self.containers.get_or_load(id, || {
                container_from_log_link(root, id)
                    .or_else(|| container_from_containerd(root, id))
                    .or_else(|| container_from_crio(root, id))
            })
        });
        let container = container.unwrap_or_default();
        let (namespace, pod_name) = match pod {
            Some(p) => (Some(p.namespace), Some(p.pod)),
            None => (container.namespace, container.pod),
        };
        [
            ("container_id", facts.container_id),
            ("container", container.container),
            ("pod", pod_name),
            ("namespace", namespace),
            ("pod_uid", facts.pod_uid),
            ("systemd_unit", facts.systemd_unit),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.filter(|v| !v.is_empty())?)))
        .collect()
    }
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
}

/// `var/log/pods/<namespace>_<pod>_<uid>/` under `root`.
fn pod_from_log_dir(root: &Path, uid: &str) -> Option<PodNames> {
    let dir = root.join("var/log/pods");
    let entries = std::fs::read_dir(&dir)
        .map_err(|err| debug!(dir = %dir.display(), %err, "no pod log directory"))
        .ok()?;
    entries.filter_map(Result::ok).find_map(|entry| {
        let name = entry.file_name();
        let mut parts = name.to_str()?.split('_');
        let (namespace, pod, found) = (parts.next()?, parts.next()?, parts.next()?);
        (found == uid && parts.next().is_none()).then(|| PodNames {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        })
    })
}

/// `var/log/containers/<pod>_<namespace>_<container>-<id>.log` under `root`.
fn container_from_log_link(root: &Path, id: &str) -> Option<ContainerNames> {
    let dir = root.join("var/log/containers");
    let suffix = format!("-{id}.log");
    let entries = std::fs::read_dir(&dir)
        .map_err(|err| debug!(dir = %dir.display(), %err, "no container log links"))
        .ok()?;
    entries.filter_map(Result::ok).find_map(|entry| {
        let name = entry.file_name();
        let mut parts = name.to_str()?.strip_suffix(&suffix)?.split('_');
        let (pod, namespace, container) = (parts.next()?, parts.next()?, parts.next()?);
        parts.next().is_none().then(|| ContainerNames {
            container: Some(container.to_owned()),
            pod: Some(pod.to_owned()),
            namespace: Some(namespace.to_owned()),
        })
    })
}

/// The part of an OCI runtime spec read here.
#[derive(Debug, serde::Deserialize)]
struct OciSpec {
    #[serde(default)]
    annotations: HashMap<String, String>,
}

fn read_annotations(path: &Path) -> Option<HashMap<String, String>> {
    let file = File::open(path).ok()?;
    let mut text = Vec::new();
    file.take(MAX_STATE_FILE).read_to_end(&mut text).ok()?;
    match serde_json::from_slice::<OciSpec>(&text) {
        Ok(spec) => Some(spec.annotations),
        Err(err) => {
            debug!(path = %path.display(), %err, "unreadable runtime state");
            None
        }
    }
}

/// containerd's bundle of a CRI container. A pod's sandbox (pause) has no
/// container name.
fn container_from_containerd(root: &Path, id: &str) -> Option<ContainerNames> {
    let path = root.join(format!(
        "run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json"
    ));
    let mut annotations = read_annotations(&path)?;
    let sandbox = annotations
        .get("io.kubernetes.cri.container-type")
        .is_some_and(|t| t == "sandbox");
    Some(ContainerNames {
        container: annotations
            .remove("io.kubernetes.cri.container-name")
            .filter(|_| !sandbox),
        pod: annotations.remove("io.kubernetes.cri.sandbox-name"),
        namespace: annotations.remove("io.kubernetes.cri.sandbox-namespace"),
    })
}

/// cri-o's state of a container. Its pod's infra container is named `POD`.
fn container_from_crio(root: &Path, id: &str) -> Option<ContainerNames> {
    let path = root.join(format!(
        "run/containers/storage/overlay-containers/{id}/userdata/config.json"
    ));
    let mut annotations = read_annotations(&path)?;
    Some(ContainerNames {
        container: annotations
            .remove("io.kubernetes.container.name")
            .filter(|name| name != "POD"),
        pod: annotations.remove("io.kubernetes.pod.name"),
        namespace: annotations.remove("io.kubernetes.pod.namespace"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    mod properties {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        /// Cgroup path segments: the shapes runtimes and systemd write,
        /// and noise.
        fn segment() -> impl Strategy<Value = String> {
            let id = "[0-9a-fA-F]{64}";
            let uid = "[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}";
            prop_oneof![
                (prop::sample::select(&CONTAINER_PREFIXES[..]), id)
                    .prop_map(|(p, id)| format!("{p}{id}.scope")),
                uid.prop_map(|u| format!("kubepods-burstable-pod{u}.slice")),
                Just("kubepods".to_owned()),
                Just("..".to_owned()),
                "[a-z@0-9-]{1,8}\\.(service|slice|scope)",
                ".{0,10}",
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// Each fact is the innermost segment that gives it, in the
            /// form its label needs.
            #[test]
            fn facts_come_from_the_innermost_segment(
                segments in vec(segment(), 0..6),
            ) {
                let path = format!("/{}", segments.join("/"));
                let facts = parse_cgroup_path(&path);
                if let Some(id) = &facts.container_id {
                    prop_assert_eq!(id.len(), 64);
                    prop_assert!(id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
                    let innermost = segments
                        .iter()
                        .flat_map(|s| s.split('/'))
                        .filter_map(container_id_of)
                        .next_back();
                    prop_assert_eq!(Some(id), innermost.as_ref());
                }
                if let Some(uid) = &facts.pod_uid {
                    prop_assert!(is_pod_uid(uid), "{}", uid);
                }
                if let Some(unit) = &facts.systemd_unit {
                    prop_assert!(unit.ends_with(".service") && unit.len() > ".service".len());
                    let innermost = path
                        .split('/')
                        .rfind(|s| s.len() > ".service".len() && s.ends_with(".service"));
                    prop_assert_eq!(Some(unit.as_str()), innermost);
                }
            }
        }
    }

    const ID: &str = "3f9d2c4b8a1e7f6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a3928170615";
    const UID: &str = "0f3a7c2e-5b1d-4e8f-9a6c-2d4b8e1f7a3c";
    const UID_: &str = "0f3a7c2e_5b1d_4e8f_9a6c_2d4b8e1f7a3c";

    fn facts(container: Option<&str>, pod: Option<&str>, unit: Option<&str>) -> CgroupFacts {
        CgroupFacts {
            container_id: container.map(str::to_owned),
            pod_uid: pod.map(str::to_owned),
            systemd_unit: unit.map(str::to_owned),
        }
    }

    fn cg(hierarchy: u32, controllers: &[&str], path: &str) -> ProcessCGroup {
        ProcessCGroup {
            hierarchy,
            controllers: controllers.iter().map(|c| c.to_string()).collect(),
            pathname: path.to_owned(),
        }
    }

    #[test]
    fn docker() {
        // cgroup v2 / systemd driver.
        assert_eq!(
            parse_cgroup_path(&format!("/system.slice/docker-{ID}.scope")),
            facts(Some(ID), None, None)
        );
        // cgroupfs driver.
        assert_eq!(
            parse_cgroup_path(&format!("/docker/{ID}")),
            facts(Some(ID), None, None)
        );
        // Docker in docker: the inner container.
        let outer = "a".repeat(64);
        assert_eq!(
            parse_cgroup_path(&format!("/docker/{outer}/docker/{ID}")),
            facts(Some(ID), None, None)
        );
    }

    #[test]
    fn containerd_and_kubernetes() {
        for qos in ["burstable", "besteffort"] {
            let path = format!(
                "/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{UID_}.slice/cri-containerd-{ID}.scope"
            );
            assert_eq!(parse_cgroup_path(&path), facts(Some(ID), Some(UID), None));
        }
        // Guaranteed pods sit right under kubepods.slice.
        let path = format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(parse_cgroup_path(&path), facts(Some(ID), Some(UID), None));
        // cgroupfs driver (v1 controllers or v2).
        for path in [
            format!("/kubepods/burstable/pod{UID}/{ID}"),
            format!("/kubepods/pod{UID}/{ID}"),
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
        ] {
            assert_eq!(parse_cgroup_path(&path), facts(Some(ID), Some(UID), None));
        }
        // A process in the pod's cgroup but in no container.
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}")),
            facts(None, Some(UID), None)
        );
        // Static pods have a 32-hex uid.
        let static_uid = "6b4a8fca1f1bcb0a1b7c6e2f3e3c3e5e";
        assert_eq!(
            parse_cgroup_path(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{static_uid}.slice/cri-containerd-{ID}.scope"
            )),
            facts(Some(ID), Some(static_uid), None)
        );
        // kind: pods inside a node container; the inner container wins.
        let node = "b".repeat(64);
        assert_eq!(
            parse_cgroup_path(&format!(
                "/system.slice/docker-{node}.scope/kubepods/besteffort/pod{UID}/{ID}"
            )),
            facts(Some(ID), Some(UID), None)
        );
        // Seen from inside a cgroup namespace: relative to its root.
        assert_eq!(
            parse_cgroup_path(&format!("/../../besteffort/pod{UID}/{ID}")),
            facts(Some(ID), Some(UID), None)
        );
        assert_eq!(
            parse_cgroup_path(&format!(
                "/../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
            )),
            facts(Some(ID), Some(UID), None)
        );
    }

    #[test]
    fn crio_and_podman() {
        let pod =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
        assert_eq!(
            parse_cgroup_path(&format!("{pod}/crio-{ID}.scope")),
            facts(Some(ID), Some(UID), None)
        );
        // Delegated sub-cgroup of a container (cri-o's infra, nested units).
        assert_eq!(
            parse_cgroup_path(&format!("{pod}/crio-{ID}.scope/container")),
            facts(Some(ID), Some(UID), None)
        );
        // conmon monitors the container from outside it.
        assert_eq!(
            parse_cgroup_path(&format!("{pod}/crio-conmon-{ID}.scope")),
            facts(None, Some(UID), None)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}/crio-{ID}")),
            facts(Some(ID), Some(UID), None)
        );
        // podman, root and rootless, systemd and cgroupfs.
        assert_eq!(
            parse_cgroup_path(&format!("/machine.slice/libpod-{ID}.scope")),
            facts(Some(ID), None, None)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/machine.slice/libpod-{ID}.scope/container")),
            facts(Some(ID), None, None)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            facts(None, None, None)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/libpod_parent/libpod-{ID}")),
            facts(Some(ID), None, None)
        );
        assert_eq!(
            parse_cgroup_path(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
            )),
            facts(Some(ID), None, Some("user@1000.service"))
        );
        // A podman pod's slice is not a Kubernetes pod.
        assert_eq!(
            parse_cgroup_path(&format!(
                "/machine.slice/machine-libpod_pod_{}.slice/libpod-{ID}.scope",
                "c".repeat(64)
            )),
            facts(Some(ID), None, None)
        );
    }

    #[test]
    fn systemd_units() {
        assert_eq!(
            parse_cgroup_path("/system.slice/nginx.service"),
            facts(None, None, Some("nginx.service"))
        );
        assert_eq!(
            parse_cgroup_path("/system.slice/system-getty.slice/getty@tty1.service"),
            facts(None, None, Some("getty@tty1.service"))
        );
        // A service's own sub-cgroups (delegation).
        assert_eq!(
            parse_cgroup_path("/system.slice/containerd.service/payload"),
            facts(None, None, Some("containerd.service"))
        );
        assert_eq!(
            parse_cgroup_path(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/pipewire.service"
            ),
            facts(None, None, Some("pipewire.service"))
        );
        assert_eq!(
            parse_cgroup_path("/user.slice/user-1000.slice/user@1000.service/init.scope"),
            facts(None, None, Some("user@1000.service"))
        );
        // Seen from a cgroup namespace inside a pod.
        assert_eq!(
            parse_cgroup_path("/../../../../system.slice/kubelet.service"),
            facts(None, None, Some("kubelet.service"))
        );
        // Scopes and slices are not services.
        for path in [
            "/",
            "/init.scope",
            "/user.slice/user-1000.slice/session-3.scope",
            "/system.slice",
            "/system.slice/run-r1234.scope",
            "/.service",
            "",
        ] {
            assert_eq!(parse_cgroup_path(path), CgroupFacts::default(), "{path}");
        }
    }

    #[test]
    fn near_misses() {
        for path in [
            // 63 and 65 hex digits; not hex.
            format!("/docker/{}", &ID[1..]),
            format!("/docker/{ID}0"),
            format!("/docker/{}", "g".repeat(64)),
            // pod<uid> outside kubepods; a malformed uid.
            format!("/system.slice/pod{UID}"),
            format!("/kubepods/burstable/pod{}", &UID[1..]),
            "/kubepods.slice/kubepods-burstable.slice".to_owned(),
        ] {
            let got = parse_cgroup_path(&path);
            assert!(
                got.container_id.is_none() && got.pod_uid.is_none(),
                "{path}: {got:?}"
            );
        }
        // Upper-case ids are written in lower case.
        assert_eq!(
            parse_cgroup_path(&format!("/docker/{}", ID.to_uppercase())).container_id,
            Some(ID.to_owned())
        );
    }

    #[test]
    fn hierarchy_preference() {
        // Hybrid host, docker with the cgroupfs driver: only v1 says it.
        let lines = [
            cg(0, &[], "/"),
            cg(1, &["name=systemd"], "/"),
            cg(4, &["memory"], &format!("/docker/{ID}")),
            cg(3, &["cpu", "cpuacct"], &format!("/docker/{ID}")),
        ];
        assert_eq!(facts_from_cgroups(&lines), facts(Some(ID), None, None));
        // The unified hierarchy wins over v1 when it says something.
        let lines = [
            cg(4, &["memory"], "/other"),
            cg(1, &["name=systemd"], "/system.slice/a.service"),
            cg(0, &[], "/system.slice/b.service"),
        ];
        assert_eq!(
            facts_from_cgroups(&lines),
            facts(None, None, Some("b.service"))
        );
        let lines = [
            cg(0, &[], "/"),
            cg(4, &["memory"], "/system.slice/a.service"),
            cg(1, &["name=systemd"], "/system.slice/c.service"),
        ];
        assert_eq!(
            facts_from_cgroups(&lines),
            facts(None, None, Some("c.service"))
        );
        // Hybrid host, cgroupfs driver: the processes stay in the runtime's
        // service in v2; v1 names the container.
        let lines = [
            cg(0, &[], "/system.slice/containerd.service"),
            cg(1, &["name=systemd"], "/system.slice/containerd.service"),
            cg(5, &["pids"], &format!("/kubepods/burstable/pod{UID}/{ID}")),
        ];
        assert_eq!(facts_from_cgroups(&lines), facts(Some(ID), Some(UID), None));
        assert_eq!(facts_from_cgroups(&[]), CgroupFacts::default());
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn labels_of(env: &mut Environment, path: &str) -> Vec<(&'static str, String)> {
        env.labels(&[cg(0, &[], path)])
    }

    fn owned(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn kubernetes_names_from_kubelet_logs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join(format!("var/log/pods/shop_cart-7d9f_{UID}/app"))).unwrap();
        std::fs::create_dir_all(r.join("var/log/pods/other_x_1111")).unwrap();
        write(
            r,
            &format!("var/log/containers/cart-7d9f_shop_app-{ID}.log"),
            "",
        );
        write(r, "var/log/containers/x_other_y-1234.log", "");
        let mut env = Environment::new(r.to_owned(), Some("n1".into()));
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            labels_of(&mut env, &path),
            owned(&[
                ("container_id", ID),
                ("container", "app"),
                ("pod", "cart-7d9f"),
                ("namespace", "shop"),
                ("pod_uid", UID),
            ])
        );
        // The pause container: in the pod, no log link, no name.
        let pause = "d".repeat(64);
        let path = format!("/kubepods/burstable/pod{UID}/{pause}");
        assert_eq!(
            labels_of(&mut env, &path),
            owned(&[
                ("container_id", &pause),
                ("pod", "cart-7d9f"),
                ("namespace", "shop"),
                ("pod_uid", UID),
            ])
        );
        // Cached: the files may go, the names stay.
        std::fs::remove_dir_all(r.join("var")).unwrap();
        assert_eq!(
            labels_of(&mut env, &format!("/kubepods/pod{UID}/{ID}")).len(),
            5
        );
        assert_eq!(env.node(), Some("n1"));
        assert_eq!(env.cache_drops(), 0);
    }

    #[test]
    fn kubernetes_names_from_runtime_state() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let sandbox = "e".repeat(64);
        write(
            r,
            &format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json"),
            r#"{"ociVersion":"1.1.0","process":{"args":["/app"]},"annotations":{
                "io.kubernetes.cri.container-type":"container",
                "io.kubernetes.cri.container-name":"web",
                "io.kubernetes.cri.sandbox-name":"front-0",
                "io.kubernetes.cri.sandbox-namespace":"prod"}}"#,
        );
        write(
            r,
            &format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{sandbox}/config.json"),
            r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox",
                "io.kubernetes.cri.container-name":"ignored",
                "io.kubernetes.cri.sandbox-name":"front-0",
                "io.kubernetes.cri.sandbox-namespace":"prod"}}"#,
        );
        let crio = "f".repeat(64);
        write(
            r,
            &format!("run/containers/storage/overlay-containers/{crio}/userdata/config.json"),
            r#"{"annotations":{"io.kubernetes.container.name":"db",
                "io.kubernetes.pod.name":"db-1","io.kubernetes.pod.namespace":"data"}}"#,
        );
        let broken = "1".repeat(64);
        write(
            r,
            &format!("run/containers/storage/overlay-containers/{broken}/userdata/config.json"),
            "{not json",
        );
        let mut env = Environment::new(r.to_owned(), None);
        let pod = format!("/kubepods.slice/kubepods-pod{UID_}.slice");
        assert_eq!(
            labels_of(&mut env, &format!("{pod}/cri-containerd-{ID}.scope")),
            owned(&[
                ("container_id", ID),
                ("container", "web"),
                ("pod", "front-0"),
                ("namespace", "prod"),
                ("pod_uid", UID),
            ])
        );
        assert_eq!(
            labels_of(&mut env, &format!("{pod}/cri-containerd-{sandbox}.scope")),
            owned(&[
                ("container_id", &sandbox),
                ("pod", "front-0"),
                ("namespace", "prod"),
                ("pod_uid", UID),
            ])
        );
        assert_eq!(
            labels_of(&mut env, &format!("{pod}/crio-{crio}.scope")),
            owned(&[
                ("container_id", &crio),
                ("container", "db"),
                ("pod", "db-1"),
                ("namespace", "data"),
                ("pod_uid", UID),
            ])
        );
        assert_eq!(
            labels_of(&mut env, &format!("/docker/{broken}")),
            owned(&[("container_id", &broken)])
        );
        assert_eq!(
            labels_of(&mut env, "/system.slice/sshd.service"),
            owned(&[("systemd_unit", "sshd.service")])
        );
        assert!(labels_of(&mut env, "/").is_empty());
    }

    #[test]
    fn missing_root_and_misses_expire() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let mut env = Environment::new(r.join("absent"), None);
        let path = format!("/kubepods/burstable/pod{UID}/{ID}");
        assert_eq!(
            labels_of(&mut env, &path),
            owned(&[("container_id", ID), ("pod_uid", UID)])
        );
        // A miss is remembered for a while, then read again.
        let mut env = Environment::new(r.to_owned(), None);
        assert_eq!(labels_of(&mut env, &path).len(), 2);
        std::fs::create_dir_all(r.join(format!("var/log/pods/ns_p_{UID}/c"))).unwrap();
        assert_eq!(labels_of(&mut env, &path).len(), 2, "cached miss");
        for (at, _) in env.pods.entries.values_mut() {
            *at -= MISS_TTL;
        }
        assert_eq!(labels_of(&mut env, &path).len(), 4);
    }

    #[test]
    fn cache_is_bounded() {
        let mut cache = LookupCache::<u32>::new();
        for i in 0..CACHE_SIZE + 10 {
            cache.get_or_load(&i.to_string(), || Some(1));
        }
        assert!(cache.entries.len() <= CACHE_SIZE);
        assert_eq!(cache.drops, CACHE_SIZE as u64);
    }

    #[test]
    fn own_process() {
        // Whatever this machine is, reading ourselves must not fail.
        let me = procfs::process::Process::myself().unwrap();
        let mut env = Environment::from_env();
        let _ = env.labels(&me.cgroups().unwrap().0);
        assert!(env.node().is_some_and(|n| !n.is_empty()));
    }

    #[test]
    fn reserved_in_config() {
        for label in LABELS {
            assert!(
                crate::config::RESERVED_LABELS.contains(&label),
                "{label} must be reserved"
            );
        }
    }
}
