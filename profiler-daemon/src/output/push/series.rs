//! Which Pyroscope series a profile's samples go to. The server makes a
//! series of every distinct label set, a profile's string sample labels
//! included (it splits an upload by them), and limits the series per
//! tenant; so the push decides the series itself: `__name__` (the profile
//! type), `service_name`, `__delta__="false"` for heap, and the kept
//! labels ([`PushSettings::keep`]: by default where the process runs, and
//! the static `--label`s). Every other sample label (pid, tid, comm,
//! thread, lock, cond, container_id, pod, ...) is summed away: samples
//! with the same stack in a series are merged, their values added, and no
//! sample label is left. The files keep every label.
//!
//! `service_name` is, in order: `[push] service_name`; a `--label
//! service_name=...`; the sample's `namespace/container` (or `container`);
//! its `systemd_unit`; its `node`; else `unknown_service` (the name
//! Pyroscope itself gives a profile without one).

use std::collections::HashMap;

use pprof_proto as pb;

use crate::config::push::{MAX_LABEL_VALUE_BYTES, PushSettings};
use crate::model::profile_kind::ProfileKind;

/// Pyroscope's fallback service name.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// The `__name__` of a profile type in Pyroscope: the names its own
/// clients use (Go's SDK, Alloy), so the UI shows the usual types.
pub fn profile_name(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Cpu => "process_cpu",
        ProfileKind::Heap => "memory",
        ProfileKind::Block => "block",
        ProfileKind::Mutex => "mutex",
        ProfileKind::Offcpu => "offcpu",
        ProfileKind::Goroutine => "goroutines",
    }
}

/// One series: its labels, sorted by name, and its samples (merged by
/// stack, without labels), which refer to the source profile's locations.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Vec<(String, String)>,
    pub samples: Vec<pb::Sample>,
}

/// Sample labels that name the service when no setting does.
const SERVICE_SOURCES: [&str; 5] = [
    "service_name",
    "container",
    "namespace",
    "systemd_unit",
    "node",
];

/// Splits `profile`'s samples into series (in the order their first
/// sample appears). A profile without samples has no series.
pub fn series_of(kind: ProfileKind, profile: &pb::Profile, settings: &PushSettings) -> Vec<Series> {
    let strings = profile.string_table.as_slice();
    // Per sample, the string index of each label that matters: the kept
    // ones, then the service sources; 0 (the empty string) when absent.
    let slots = settings.keep.len() + SERVICE_SOURCES.len();
    let slot_of = |key: &str| -> Option<usize> {
        settings
            .keep
            .iter()
            .position(|(k, _)| k == key)
            .or_else(|| {
                SERVICE_SOURCES
                    .iter()
                    .position(|s| *s == key)
                    .map(|p| settings.keep.len() + p)
            })
    };
    // Label key index -> slot, looked up once per distinct key.
    let mut slot_cache: HashMap<i64, Option<usize>> = HashMap::new();
    // Slot values -> series index, and series labels -> series index (two
    // value sets may give the same labels once the dropped ones are gone).
    let mut by_values: HashMap<Vec<i64>, usize> = HashMap::new();
    let mut by_labels: HashMap<Vec<(String, String)>, usize> = HashMap::new();
    let mut series: Vec<Series> = Vec::new();
    let mut merged: Vec<HashMap<Vec<u64>, usize>> = Vec::new();
    let mut values = vec![0i64; slots];

    for sample in &profile.sample {
        values.iter_mut().for_each(|v| *v = 0);
        for label in &sample.label {
            if label.str == 0 {
                continue;
            }
            let slot = *slot_cache
                .entry(label.key)
                .or_insert_with(|| slot_of(text(strings, label.key)));
            if let Some(slot) = slot {
                values[slot] = label.str;
            }
        }
        let index = match by_values.get(&values) {
            Some(&i) => i,
            None => {
                let labels = series_labels(kind, settings, &values, strings);
                let i = *by_labels.entry(labels.clone()).or_insert_with(|| {
                    series.push(Series {
                        labels,
                        samples: Vec::new(),
                    });
                    merged.push(HashMap::new());
                    series.len() - 1
                });
                by_values.insert(values.clone(), i);
                i
            }
        };
        let target = &mut series[index];
        match merged[index].get(&sample.location_id) {
            Some(&at) => {
                let into = &mut target.samples[at].value;
                for (a, b) in into.iter_mut().zip(&sample.value) {
                    *a = a.saturating_add(*b);
                }
            }
            None => {
                merged[index].insert(sample.location_id.clone(), target.samples.len());
                target.samples.push(pb::Sample {
                    location_id: sample.location_id.clone(),
                    value: sample.value.clone(),
                    label: Vec::new(),
                });
            }
        }
    }
    series
}

/// The labels of the series whose slot values are `values`, sorted.
fn series_labels(
    kind: ProfileKind,
    settings: &PushSettings,
    values: &[i64],
    strings: &[String],
) -> Vec<(String, String)> {
    // A kept label that is also a service source sits in the keep slot.
    let get = |name: &str| -> String {
        let slot = settings
            .keep
            .iter()
            .position(|(k, _)| k == name)
            .or_else(|| {
                SERVICE_SOURCES
                    .iter()
                    .position(|s| *s == name)
                    .map(|p| settings.keep.len() + p)
            });
        slot.map_or("", |i| text(strings, values[i])).to_owned()
    };
    let service = match &settings.service_name {
        Some(name) => name.clone(),
        None => service_name(
            &get("service_name"),
            &get("namespace"),
            &get("container"),
            &get("systemd_unit"),
            &get("node"),
        ),
    };
    let mut labels = vec![
        ("__name__".to_owned(), profile_name(kind).to_owned()),
        ("service_name".to_owned(), clip(&service).to_owned()),
    ];
    if kind == ProfileKind::Heap {
        // Our alloc_* are already the window's own (not cumulative like
        // Go's heap profile): the server must not take differences.
        labels.push(("__delta__".to_owned(), "false".to_owned()));
    }
    for (i, (_, name)) in settings.keep.iter().enumerate() {
        let value = text(strings, values[i]);
        // An empty value is no label (Prometheus' rule).
        if !value.is_empty() {
            labels.push((name.clone(), clip(value).to_owned()));
        }
    }
    labels.sort();
    labels
}

/// String `i` of the table; "" when out of range (a foreign profile).
fn text(strings: &[String], i: i64) -> &str {
    usize::try_from(i)
        .ok()
        .and_then(|i| strings.get(i))
        .map_or("", String::as_str)
}

/// The per-workload service name (see the module doc).
pub fn service_name(
    given: &str,
    namespace: &str,
    container: &str,
    unit: &str,
    node: &str,
) -> String {
    if !given.is_empty() {
        given.to_owned()
    } else if !container.is_empty() && !namespace.is_empty() {
        format!("{namespace}/{container}")
    } else if !container.is_empty() {
        container.to_owned()
    } else if !unit.is_empty() {
        unit.to_owned()
    } else if !node.is_empty() {
        node.to_owned()
    } else {
        UNKNOWN_SERVICE.to_owned()
    }
}

/// `value` cut to the server's longest label value, at a character edge.
fn clip(value: &str) -> &str {
    if value.len() <= MAX_LABEL_VALUE_BYTES {
        return value;
    }
    let mut end = MAX_LABEL_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

#[cfg(test)]
pub(crate) use tests::{TestSample, profile as tests_profile};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::push::build;
    use std::time::Duration;

    /// A profile with `samples` as (stack, value, labels); one string per
    /// distinct text.
    /// A sample as the tests write it: stack, value, string labels.
    pub(crate) type TestSample<'a> = (&'a [u64], i64, &'a [(&'a str, &'a str)]);

    pub(crate) fn profile(samples: &[TestSample]) -> pb::Profile {
        let mut strings = vec![String::new()];
        let mut intern = |s: &str| -> i64 {
            match strings.iter().position(|x| x == s) {
                Some(i) => i as i64,
                None => {
                    strings.push(s.to_owned());
                    strings.len() as i64 - 1
                }
            }
        };
        let sample_type = vec![pb::ValueType {
            r#type: intern("samples"),
            unit: intern("count"),
        }];
        let sample = samples
            .iter()
            .map(|(stack, value, labels)| pb::Sample {
                location_id: stack.to_vec(),
                value: vec![*value],
                label: labels
                    .iter()
                    .map(|(k, v)| pb::Label {
                        key: intern(k),
                        str: intern(v),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect();
        pb::Profile {
            sample_type,
            sample,
            string_table: strings,
            ..Default::default()
        }
    }

    fn settings(table: &str, labels: &[(&str, &str)]) -> PushSettings {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        build(
            "http://h",
            Some(&toml::from_str(table).unwrap()),
            &labels,
            Duration::from_secs(60),
        )
        .unwrap()
    }

    fn names(s: &Series) -> Vec<String> {
        s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn threads_and_locks_are_summed_per_workload() {
        let web = [
            ("pid", "10"),
            ("tid", "11"),
            ("thread", "w1"),
            ("lock", "0x1"),
            ("container", "web"),
            ("namespace", "shop"),
            ("pod", "web-1"),
            ("node", "n1"),
            ("env", "prod"),
        ];
        let web2 = [
            ("pid", "20"),
            ("tid", "22"),
            ("thread", "w2"),
            ("lock", "0x2"),
            ("container", "web"),
            ("namespace", "shop"),
            ("pod", "web-2"),
            ("node", "n1"),
            ("env", "prod"),
        ];
        let sshd = [
            ("pid", "5"),
            ("systemd_unit", "ssh.service"),
            ("node", "n1"),
            ("env", "prod"),
        ];
        let bare = [("pid", "6"), ("node", "n1"), ("env", "prod")];
        let p = profile(&[
            (&[1, 2], 3, &web),
            (&[1, 2], 4, &web2),
            (&[3], 5, &web2),
            (&[1, 2], 7, &sshd),
            (&[1], 1, &bare),
        ]);
        let s = settings("", &[("env", "prod")]);
        let series = series_of(ProfileKind::Mutex, &p, &s);
        assert_eq!(series.len(), 3, "{series:#?}");
        assert_eq!(
            names(&series[0]),
            [
                "__name__=mutex",
                "container=web",
                "env=prod",
                "namespace=shop",
                "node=n1",
                "service_name=shop/web"
            ]
        );
        assert_eq!(series[0].samples.len(), 2);
        assert_eq!(series[0].samples[0].value, [7]);
        assert!(series[0].samples.iter().all(|s| s.label.is_empty()));
        assert_eq!(
            names(&series[1]),
            [
                "__name__=mutex",
                "env=prod",
                "node=n1",
                "service_name=ssh.service",
                "systemd_unit=ssh.service"
            ]
        );
        assert_eq!(
            names(&series[2]),
            ["__name__=mutex", "env=prod", "node=n1", "service_name=n1"]
        );
        // Nothing lost: the values add up.
        let total =
            |ss: &[Series]| -> i64 { ss.iter().flat_map(|s| &s.samples).map(|s| s.value[0]).sum() };
        assert_eq!(total(&series), 20);
    }

    #[test]
    fn settings_choose_the_service_and_the_labels() {
        let p = profile(&[
            (&[1], 1, &[("pid", "1"), ("container", "a"), ("node", "n")]),
            (&[1], 2, &[("pid", "2"), ("container", "b"), ("node", "n")]),
        ]);
        let one = settings("service_name = \"all\"\nlabels = []", &[]);
        let series = series_of(ProfileKind::Heap, &p, &one);
        assert_eq!(series.len(), 1);
        assert_eq!(
            names(&series[0]),
            ["__delta__=false", "__name__=memory", "service_name=all"]
        );
        assert_eq!(series[0].samples[0].value, [3]);
        // Keeping pid: a series per process, as asked.
        let per_pid = settings("labels = [\"pid\"]", &[]);
        let series = series_of(ProfileKind::Cpu, &p, &per_pid);
        assert_eq!(series.len(), 2);
        assert_eq!(
            names(&series[1]),
            ["__name__=process_cpu", "pid=2", "service_name=b"]
        );
        // A static service_name label names the service.
        let p = profile(&[(&[1], 1, &[("service_name", "api"), ("node", "n")])]);
        let s = settings("", &[("service_name", "api")]);
        assert_eq!(
            names(&series_of(ProfileKind::Offcpu, &p, &s)[0]),
            ["__name__=offcpu", "node=n", "service_name=api"]
        );
        assert!(series_of(ProfileKind::Cpu, &profile(&[]), &s).is_empty());
    }

    #[test]
    fn long_values_are_clipped_at_a_character() {
        let long = "é".repeat(MAX_LABEL_VALUE_BYTES);
        assert_eq!(clip(&long).len(), MAX_LABEL_VALUE_BYTES);
        assert_eq!(clip("short"), "short");
        let odd = format!("a{long}");
        assert!(clip(&odd).len() <= MAX_LABEL_VALUE_BYTES);
        assert_eq!(service_name("", "", "", "", ""), UNKNOWN_SERVICE);
    }
}
