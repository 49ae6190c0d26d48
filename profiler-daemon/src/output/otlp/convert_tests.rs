//! The conversion against the pinned proto's rules: dictionary entries 0
//! are zero values, every index is in range, one value per sample, values
//! summed per type equal the pprof's, process labels on the resource,
//! the others on samples.

use super::*;

fn profile() -> pb::Profile {
    let strings: Vec<String> = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "main",
        "burn",
        "/bin/app",
        "pid",
        "tid",
        "thread",
        "node",
        "env",
        "10",
        "11",
        "n1",
        "prod",
        "20",
        "21",
        "abcdef",
        "comm",
        "app",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let s = |t: &str| strings.iter().position(|x| x == t).unwrap() as i64;
    let label = |k: &str, v: &str| pb::Label {
        key: s(k),
        str: s(v),
        ..Default::default()
    };
    let process = |pid: &str, tid: &str| {
        vec![
            label("pid", pid),
            label("tid", tid),
            label("thread", "app"),
            label("comm", "app"),
            label("node", "n1"),
            label("env", "prod"),
        ]
    };
    pb::Profile {
        sample_type: vec![
            pb::ValueType {
                r#type: s("samples"),
                unit: s("count"),
            },
            pb::ValueType {
                r#type: s("cpu"),
                unit: s("nanoseconds"),
            },
        ],
        // The last sample's unknown location keeps the stack's depth.
        sample: [
            (vec![2, 1], [3, 30], ("10", "11")),
            (vec![1], [0, 5], ("10", "10")),
            (vec![2, 1], [4, 40], ("20", "21")),
            (vec![99], [1, 1], ("20", "21")),
        ]
        .into_iter()
        .map(|(location_id, value, (pid, tid))| pb::Sample {
            location_id,
            value: value.to_vec(),
            label: process(pid, tid),
        })
        .collect(),
        mapping: vec![pb::Mapping {
            id: 1,
            memory_start: 0x1000,
            memory_limit: 0x9000,
            filename: s("/bin/app"),
            build_id: s("abcdef"),
            ..Default::default()
        }],
        location: [(1, 0x1100, 1, 7), (2, 0x1200, 2, 0)]
            .iter()
            .map(|&(id, address, function_id, line)| pb::Location {
                id,
                mapping_id: 1,
                address,
                line: vec![pb::Line {
                    function_id,
                    line,
                    column: 0,
                }],
                ..Default::default()
            })
            .collect(),
        function: vec![
            pb::Function {
                id: 1,
                name: s("main"),
                system_name: s("main"),
                ..Default::default()
            },
            pb::Function {
                id: 2,
                name: s("burn"),
                ..Default::default()
            },
        ],
        string_table: strings.clone(),
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        period_type: Some(pb::ValueType {
            r#type: s("cpu"),
            unit: s("nanoseconds"),
        }),
        period: 10_101_010,
        ..Default::default()
    }
}

fn convert_it(static_labels: &[(String, String)]) -> ExportProfilesServiceRequest {
    let mut n = 0u128;
    let mut id = || {
        n += 1;
        n.to_be_bytes()
    };
    let mut cx = Context {
        service_name: None,
        static_labels,
        profile_id: &mut id,
    };
    convert(ProfileKind::Cpu, &profile(), &mut cx)
}

fn string_value(v: &Option<AnyValue>) -> Option<&str> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn int_value(v: &Option<AnyValue>) -> Option<i64> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::IntValue(n) => Some(*n),
        _ => None,
    }
}

#[test]
fn the_dictionary_follows_the_rules() {
    let r = convert_it(&[("env".to_owned(), "prod".to_owned())]);
    let d = r.dictionary.as_ref().unwrap();
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], Mapping::default());
    assert_eq!(d.location_table[0], Location::default());
    assert_eq!(d.function_table[0], Function::default());
    assert_eq!(d.stack_table[0], Stack::default());
    assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
    assert_eq!(d.link_table[0].trace_id, [0; 16]);
    assert_eq!(d.link_table[0].span_id, [0; 8]);
    let strings = d.string_table.len() as i32;
    let in_range = |i: i32, n: usize| i >= 0 && (i as usize) < n;
    for s in &d.stack_table {
        for &l in &s.location_indices {
            assert!(in_range(l, d.location_table.len()));
        }
    }
    for l in &d.location_table[1..] {
        assert!(in_range(l.mapping_index, d.mapping_table.len()));
        for line in &l.lines {
            assert!(in_range(line.function_index, d.function_table.len()));
        }
    }
    for f in &d.function_table[1..] {
        assert!(f.name_strindex < strings && f.name_strindex > 0);
    }
    for a in &d.attribute_table[1..] {
        assert!(a.key_strindex > 0 && a.key_strindex < strings);
    }
    // Only what is used, each once: main, burn; two real locations.
    assert_eq!(d.function_table.len(), 3);
    assert_eq!(d.location_table.len(), 3);
    assert_eq!(d.mapping_table.len(), 2);
    let build_id = &d.attribute_table[d.mapping_table[1].attribute_indices[0] as usize];
    assert_eq!(
        d.string_table[build_id.key_strindex as usize],
        "process.executable.build_id.gnu"
    );
    let mut unique = d.string_table.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), d.string_table.len());
}

#[test]
fn a_resource_per_process_and_a_profile_per_type() {
    let r = convert_it(&[("env".to_owned(), "prod".to_owned())]);
    let d = r.dictionary.as_ref().unwrap();
    assert_eq!(r.resource_profiles.len(), 2);
    let mut totals = vec![0i64; 2];
    for rp in &r.resource_profiles {
        let attrs = &rp.resource.as_ref().unwrap().attributes;
        let get = |k: &str| attrs.iter().find(|a| a.key == k).map(|a| &a.value);
        assert_eq!(string_value(get("service.name").unwrap()), Some("n1"));
        assert_eq!(string_value(get("host.name").unwrap()), Some("n1"));
        assert_eq!(string_value(get("env").unwrap()), Some("prod"));
        assert_eq!(
            string_value(get("process.executable.name").unwrap()),
            Some("app")
        );
        assert!(int_value(get("process.pid").unwrap()).is_some());
        let scope = &rp.scope_profiles[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "profilerd");
        for p in &scope.profiles {
            let t = p.sample_type.unwrap();
            let name = &d.string_table[t.type_strindex as usize];
            let index = usize::from(name == "cpu");
            assert_eq!(p.time_unix_nano, 1_700_000_000_000_000_000);
            assert_eq!(p.duration_nano, 10_000_000_000);
            assert_eq!(p.period, 10_101_010);
            assert_eq!(p.profile_id.len(), 16);
            assert_ne!(p.profile_id, [0; 16]);
            let kind = &d.attribute_table[p.attribute_indices[0] as usize];
            assert_eq!(d.string_table[kind.key_strindex as usize], PROFILE_TYPE_KEY);
            for s in &p.samples {
                assert_eq!(s.values.len(), 1);
                assert_ne!(s.values[0], 0);
                totals[index] += s.values[0];
                let keys: Vec<&str> = s
                    .attribute_indices
                    .iter()
                    .map(|&a| {
                        d.string_table[d.attribute_table[a as usize].key_strindex as usize].as_str()
                    })
                    .collect();
                assert_eq!(keys, ["thread.id", "thread.name"]);
            }
        }
    }
    assert_eq!(totals, [8, 76]);
}

#[test]
fn stacks_are_leaf_first_with_functions() {
    let r = convert_it(&[]);
    let d = r.dictionary.as_ref().unwrap();
    let first = &r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    let stack = &d.stack_table[first.stack_index as usize];
    let names: Vec<&str> = stack
        .location_indices
        .iter()
        .map(|&l| {
            let f = d.location_table[l as usize].lines[0].function_index;
            d.string_table[d.function_table[f as usize].name_strindex as usize].as_str()
        })
        .collect();
    assert_eq!(names, ["burn", "main"]);
    assert_eq!(
        d.location_table[stack.location_indices[1] as usize].lines[0].line,
        7
    );
    // The unknown location is entry 0.
    assert!(d.stack_table.iter().any(|s| s.location_indices == [0]));
}
