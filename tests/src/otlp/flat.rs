//! A decoded OTLP request as a list of samples, each with everything it
//! refers to resolved through the dictionary: what the tests compare with
//! the pprof files the daemon wrote.

use std::collections::BTreeMap;

use super::api::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest;
use super::api::opentelemetry::proto::common::v1::{AnyValue, any_value};

/// One sample of one profile, resolved.
#[derive(Debug, Clone)]
pub struct FlatSample {
    /// The profile's `profilerd.profile_type` attribute (cpu, heap, ...).
    pub profile_type: String,
    /// (type, unit) of the profile's sample type.
    pub sample_type: (String, String),
    pub time_unix_nano: u64,
    pub duration_nano: u64,
    pub period: i64,
    /// The resource's attributes, values as text.
    pub resource: BTreeMap<String, String>,
    /// The sample's attributes, values as text.
    pub attributes: BTreeMap<String, String>,
    /// Function names, leaf first (a location's inlined lines in order).
    pub functions: Vec<String>,
    pub value: i64,
}

/// An attribute value as text.
pub fn text(value: Option<&AnyValue>, strings: &[String]) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::StringValueStrindex(i)) => {
            strings.get(*i as usize).cloned().unwrap_or_default()
        }
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Every sample of `request` (validated first: indices are trusted).
pub fn flatten(request: &ExportProfilesServiceRequest) -> Vec<FlatSample> {
    let Some(d) = &request.dictionary else {
        return Vec::new();
    };
    let s = |i: i32| d.string_table[i as usize].clone();
    let attrs = |indices: &[i32]| -> BTreeMap<String, String> {
        indices
            .iter()
            .map(|&a| {
                let kv = &d.attribute_table[a as usize];
                (s(kv.key_strindex), text(kv.value.as_ref(), &d.string_table))
            })
            .collect()
    };
    let mut out = Vec::new();
    for rp in &request.resource_profiles {
        let resource: BTreeMap<String, String> = rp
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .map(|a| (a.key.clone(), text(a.value.as_ref(), &d.string_table)))
            .collect();
        for sp in &rp.scope_profiles {
            for p in &sp.profiles {
                let t = p.sample_type.unwrap_or_default();
                let profile_attrs = attrs(&p.attribute_indices);
                for sample in &p.samples {
                    let stack = &d.stack_table[sample.stack_index as usize];
                    let functions = stack
                        .location_indices
                        .iter()
                        .flat_map(|&l| &d.location_table[l as usize].lines)
                        .map(|line| s(d.function_table[line.function_index as usize].name_strindex))
                        .collect();
                    out.push(FlatSample {
                        profile_type: profile_attrs
                            .get("profilerd.profile_type")
                            .cloned()
                            .unwrap_or_default(),
                        sample_type: (s(t.type_strindex), s(t.unit_strindex)),
                        time_unix_nano: p.time_unix_nano,
                        duration_nano: p.duration_nano,
                        period: p.period,
                        resource: resource.clone(),
                        attributes: attrs(&sample.attribute_indices),
                        functions,
                        value: sample.values.iter().sum(),
                    });
                }
            }
        }
    }
    out
}
