//! One pprof profile (a window of one type) as one OTLP
//! `ExportProfilesServiceRequest`, by the rules of the pinned
//! `v1development` proto:
//!
//! - one `ResourceProfiles` per process: the sample labels that say where a
//!   process runs become resource attributes by OpenTelemetry's semantic
//!   conventions (`process.pid`, `process.executable.name`, `host.name`,
//!   `container.id`, `container.name`, `k8s.pod.name`, `k8s.namespace.name`,
//!   `k8s.pod.uid`; `systemd_unit` keeps its name), with the static
//!   `--label`s and `service.name` (named as the push names a series'
//!   service: push/series.rs);
//! - one `ScopeProfiles` (scope `profilerd` and its version) holding one
//!   `Profile` per pprof sample type (OTLP's profile has one), each with the
//!   window's time, duration, period, a random id, and the attribute
//!   `profilerd.profile_type` (block and mutex share their sample types);
//! - samples keep their stack (leaf first) and their other labels as
//!   attributes (`tid` → `thread.id`, `thread` → `thread.name`, `lock`,
//!   `cond`, ...); a sample whose value of a type is 0 is left out of that
//!   type's profile (an OTLP sample needs a value);
//! - one `ProfilesDictionary` for the request, holding only what the
//!   samples use, each entry once, every table's entry 0 its zero value
//!   (the link table's is the 16- and 8-byte zero ids the proto asks for).

use std::collections::HashMap;

use pprof_proto as pb;

use super::wire::{
    AnyValue, ExportProfilesServiceRequest, Function, InstrumentationScope, KeyValue,
    KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary, Resource,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType, any_value,
};
use crate::model::profile_kind::ProfileKind;
use crate::output::push::series::service_name;

/// The instrumentation scope of every profile.
pub const SCOPE_NAME: &str = "profilerd";
/// The profile attribute that names the profile type.
pub const PROFILE_TYPE_KEY: &str = "profilerd.profile_type";

/// A sample label that describes the process: its attribute name, and
/// whether its value is a number.
fn resource_attribute(label: &str) -> Option<(&'static str, bool)> {
    Some(match label {
        "pid" => ("process.pid", true),
        "comm" => ("process.executable.name", false),
        "node" => ("host.name", false),
        "container_id" => ("container.id", false),
        "container" => ("container.name", false),
        "pod" => ("k8s.pod.name", false),
        "namespace" => ("k8s.namespace.name", false),
        "pod_uid" => ("k8s.pod.uid", false),
        "systemd_unit" => ("systemd_unit", false),
        _ => return None,
    })
}

/// A sample label that stays on the sample, under its attribute name.
fn sample_attribute(label: &str) -> (&str, bool) {
    match label {
        "tid" => ("thread.id", true),
        "thread" => ("thread.name", false),
        other => (other, false),
    }
}

/// What the conversion needs besides the profile.
pub struct Context<'a> {
    /// `service.name` of every resource, instead of the per-workload one.
    pub service_name: Option<&'a str>,
    /// The static `--label`s: resource attributes of every resource.
    pub static_labels: &'a [(String, String)],
    /// A fresh, non-zero profile id per call.
    pub profile_id: &'a mut dyn FnMut() -> [u8; 16],
}

/// The request that carries `profile`. A profile without samples gives a
/// request without resources.
pub fn convert(
    kind: ProfileKind,
    profile: &pb::Profile,
    cx: &mut Context,
) -> ExportProfilesServiceRequest {
    let mut d = Dictionary::new(profile);
    let strings = profile.string_table.as_slice();
    let text = |i: i64| -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| strings.get(i))
            .map_or("", String::as_str)
    };
    let statics: Vec<&str> = cx.static_labels.iter().map(|(k, _)| k.as_str()).collect();

    let types: Vec<ValueType> = profile
        .sample_type
        .iter()
        .map(|t| ValueType {
            type_strindex: d.string(text(t.r#type)),
            unit_strindex: d.string(text(t.unit)),
        })
        .collect();
    let period_type = profile.period_type.as_ref().map(|t| ValueType {
        type_strindex: d.string(text(t.r#type)),
        unit_strindex: d.string(text(t.unit)),
    });
    let kind_attribute = d.attribute(PROFILE_TYPE_KEY, AnyValue::string(kind.name()));

    // Resources by their labels' string indices (key, value, num).
    let mut by_labels: HashMap<Vec<(i64, i64, i64)>, usize> = HashMap::new();
    let mut resources: Vec<(Resource, Vec<Vec<Sample>>)> = Vec::new();
    let mut own: Vec<(i64, i64, i64)> = Vec::new();
    let mut attributes: Vec<i32> = Vec::new();
    for sample in &profile.sample {
        own.clear();
        attributes.clear();
        for label in &sample.label {
            let key = text(label.key);
            if resource_attribute(key).is_some() || statics.contains(&key) {
                own.push((label.key, label.str, label.num));
                continue;
            }
            let (name, numeric) = sample_attribute(key);
            let value = match (numeric, label.str) {
                (_, 0) => AnyValue::int(label.num),
                (true, s) => match text(s).parse() {
                    Ok(n) => AnyValue::int(n),
                    Err(_) => AnyValue::string(text(s)),
                },
                (false, s) => AnyValue::string(text(s)),
            };
            let unit = text(label.num_unit);
            let index = d.attribute_with_unit(name, value, unit);
            // Keys are unique in a sample's attributes: the first wins.
            let key_index = d.attributes[index as usize].key_strindex;
            if !attributes
                .iter()
                .any(|&a| d.attributes[a as usize].key_strindex == key_index)
            {
                attributes.push(index);
            }
        }
        own.sort_unstable();
        let r = match by_labels.get(&own) {
            Some(&r) => r,
            None => {
                let resource = resource(&own, text, cx);
                resources.push((resource, vec![Vec::new(); types.len()]));
                by_labels.insert(own.clone(), resources.len() - 1);
                resources.len() - 1
            }
        };
        let stack = d.stack(&sample.location_id);
        for (t, value) in sample.value.iter().enumerate().take(types.len()) {
            if *value == 0 {
                continue;
            }
            resources[r].1[t].push(Sample {
                stack_index: stack,
                attribute_indices: attributes.clone(),
                link_index: 0,
                values: vec![*value],
            });
        }
    }

    let scope = InstrumentationScope {
        name: SCOPE_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let resource_profiles = resources
        .into_iter()
        .map(|(resource, per_type)| {
            let profiles = per_type
                .into_iter()
                .zip(&types)
                .filter(|(samples, _)| !samples.is_empty())
                .map(|(samples, sample_type)| Profile {
                    sample_type: Some(*sample_type),
                    samples,
                    time_unix_nano: u64::try_from(profile.time_nanos).unwrap_or(0),
                    duration_nano: u64::try_from(profile.duration_nanos).unwrap_or(0),
                    period_type,
                    period: profile.period,
                    profile_id: (cx.profile_id)().to_vec(),
                    dropped_attributes_count: 0,
                    attribute_indices: vec![kind_attribute],
                })
                .collect();
            ResourceProfiles {
                resource: Some(resource),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(scope.clone()),
                    profiles,
                }],
            }
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(d.finish()),
    }
}

/// The resource of a process with the labels `own` (key, str, num).
fn resource<'s>(own: &[(i64, i64, i64)], text: impl Fn(i64) -> &'s str, cx: &Context) -> Resource {
    let get = |name: &str| -> &str {
        own.iter()
            .find(|(k, _, _)| text(*k) == name)
            .map_or("", |(_, s, _)| text(*s))
    };
    let service = match cx.service_name {
        Some(name) => name.to_owned(),
        None => service_name(
            cx.static_labels
                .iter()
                .find(|(k, _)| k == "service_name")
                .map_or("", |(_, v)| v.as_str()),
            get("namespace"),
            get("container"),
            get("systemd_unit"),
            get("node"),
        ),
    };
    let mut attributes = vec![KeyValue {
        key: "service.name".to_owned(),
        value: Some(AnyValue::string(service)),
    }];
    for &(key, s, num) in own {
        let label = text(key);
        let Some((name, numeric)) = resource_attribute(label) else {
            continue;
        };
        let value = match (numeric, s) {
            (_, 0) => AnyValue::int(num),
            (true, s) => text(s)
                .parse()
                .map_or_else(|_| AnyValue::string(text(s)), AnyValue::int),
            (false, s) => AnyValue::string(text(s)),
        };
        attributes.push(KeyValue {
            key: name.to_owned(),
            value: Some(value),
        });
    }
    for (key, value) in cx.static_labels {
        if key == "service_name" || attributes.iter().any(|a| a.key == *key) {
            continue;
        }
        attributes.push(KeyValue {
            key: key.clone(),
            value: Some(AnyValue::string(value.clone())),
        });
    }
    Resource { attributes }
}

/// An attribute value as a map key.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Value {
    Str(String),
    Int(i64),
}

/// The request's dictionary as it is built: each table with its zero value
/// at 0, and the maps from pprof ids and values to indices.
struct Dictionary<'p> {
    profile: &'p pb::Profile,
    strings: Vec<String>,
    string_index: HashMap<String, i32>,
    attributes: Vec<KeyValueAndUnit>,
    attribute_index: HashMap<(i32, Value, i32), i32>,
    functions: Vec<Function>,
    function_index: HashMap<u64, i32>,
    mappings: Vec<Mapping>,
    mapping_index: HashMap<u64, i32>,
    locations: Vec<Location>,
    location_index: HashMap<u64, i32>,
    stacks: Vec<Stack>,
    stack_index: HashMap<Vec<u64>, i32>,
    /// pprof ids to positions in the profile's tables.
    pprof_functions: HashMap<u64, usize>,
    pprof_mappings: HashMap<u64, usize>,
    pprof_locations: HashMap<u64, usize>,
}

impl<'p> Dictionary<'p> {
    fn new(profile: &'p pb::Profile) -> Self {
        let ids = |ids: Vec<u64>| -> HashMap<u64, usize> {
            ids.into_iter().enumerate().map(|(i, id)| (id, i)).collect()
        };
        Dictionary {
            profile,
            strings: vec![String::new()],
            string_index: HashMap::from([(String::new(), 0)]),
            attributes: vec![KeyValueAndUnit::default()],
            attribute_index: HashMap::new(),
            functions: vec![Function::default()],
            function_index: HashMap::new(),
            mappings: vec![Mapping::default()],
            mapping_index: HashMap::new(),
            locations: vec![Location::default()],
            location_index: HashMap::new(),
            stacks: vec![Stack::default()],
            stack_index: HashMap::from([(Vec::new(), 0)]),
            pprof_functions: ids(profile.function.iter().map(|f| f.id).collect()),
            pprof_mappings: ids(profile.mapping.iter().map(|m| m.id).collect()),
            pprof_locations: ids(profile.location.iter().map(|l| l.id).collect()),
        }
    }

    /// The index of string `s`, added if new.
    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = self.strings.len() as i32;
        self.strings.push(s.to_owned());
        self.string_index.insert(s.to_owned(), i);
        i
    }

    /// The pprof string `i` of the profile, as an index here.
    fn pprof_string(&mut self, i: i64) -> i32 {
        let profile = self.profile;
        let s = usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("", String::as_str);
        self.string(s)
    }

    fn attribute(&mut self, key: &str, value: AnyValue) -> i32 {
        self.attribute_with_unit(key, value, "")
    }

    fn attribute_with_unit(&mut self, key: &str, value: AnyValue, unit: &str) -> i32 {
        let key = self.string(key);
        let unit = self.string(unit);
        let as_key = match &value.value {
            Some(any_value::Value::IntValue(n)) => Value::Int(*n),
            Some(any_value::Value::StringValue(s)) => Value::Str(s.clone()),
            None => Value::Str(String::new()),
        };
        if let Some(&i) = self.attribute_index.get(&(key, as_key.clone(), unit)) {
            return i;
        }
        let i = self.attributes.len() as i32;
        self.attributes.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(value),
            unit_strindex: unit,
        });
        self.attribute_index.insert((key, as_key, unit), i);
        i
    }

    /// The stack of pprof locations `ids` (leaf first).
    fn stack(&mut self, ids: &[u64]) -> i32 {
        if let Some(&i) = self.stack_index.get(ids) {
            return i;
        }
        let location_indices = ids.iter().map(|&id| self.location(id)).collect();
        let i = self.stacks.len() as i32;
        self.stacks.push(Stack { location_indices });
        self.stack_index.insert(ids.to_vec(), i);
        i
    }

    /// The location of pprof location `id`; an unknown id is an empty
    /// location of its own (the stack keeps its depth).
    fn location(&mut self, id: u64) -> i32 {
        if let Some(&i) = self.location_index.get(&id) {
            return i;
        }
        let profile = self.profile;
        let location = match self.pprof_locations.get(&id) {
            Some(&at) => {
                let l = &profile.location[at];
                Location {
                    mapping_index: self.mapping(l.mapping_id),
                    address: l.address,
                    lines: l
                        .line
                        .iter()
                        .map(|line| Line {
                            function_index: self.function(line.function_id),
                            line: line.line,
                            column: line.column,
                        })
                        .collect(),
                    attribute_indices: Vec::new(),
                }
            }
            None => Location::default(),
        };
        if location == Location::default() {
            // The zero value is entry 0; it is not repeated.
            self.location_index.insert(id, 0);
            return 0;
        }
        let i = self.locations.len() as i32;
        self.locations.push(location);
        self.location_index.insert(id, i);
        i
    }

    fn mapping(&mut self, id: u64) -> i32 {
        if id == 0 {
            return 0;
        }
        if let Some(&i) = self.mapping_index.get(&id) {
            return i;
        }
        let profile = self.profile;
        let Some(&at) = self.pprof_mappings.get(&id) else {
            return 0;
        };
        let m = &profile.mapping[at];
        let build_id = usize::try_from(m.build_id)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .filter(|s| !s.is_empty());
        let attribute_indices = match build_id {
            Some(id) => vec![self.attribute(
                "process.executable.build_id.gnu",
                AnyValue::string(id.clone()),
            )],
            None => Vec::new(),
        };
        let mapping = Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex: self.pprof_string(m.filename),
            attribute_indices,
        };
        let i = self.mappings.len() as i32;
        self.mappings.push(mapping);
        self.mapping_index.insert(id, i);
        i
    }

    fn function(&mut self, id: u64) -> i32 {
        if let Some(&i) = self.function_index.get(&id) {
            return i;
        }
        let profile = self.profile;
        let Some(&at) = self.pprof_functions.get(&id) else {
            return 0;
        };
        let f = &profile.function[at];
        let function = Function {
            name_strindex: self.pprof_string(f.name),
            system_name_strindex: self.pprof_string(f.system_name),
            filename_strindex: self.pprof_string(f.filename),
            start_line: f.start_line,
        };
        if function.name_strindex == 0
            && function.system_name_strindex == 0
            && function.filename_strindex == 0
        {
            // A function must have a name or a file; a line without one
            // points at entry 0, no function.
            self.function_index.insert(id, 0);
            return 0;
        }
        let i = self.functions.len() as i32;
        self.functions.push(function);
        self.function_index.insert(id, i);
        i
    }

    fn finish(self) -> ProfilesDictionary {
        ProfilesDictionary {
            mapping_table: self.mappings,
            location_table: self.locations,
            function_table: self.functions,
            link_table: vec![Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: self.strings,
            attribute_table: self.attributes,
            stack_table: self.stacks,
        }
    }
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
