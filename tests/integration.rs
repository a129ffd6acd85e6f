//! Every integration test, in one binary (`autotests = false` in Cargo.toml): each
//! `tests/NAME.rs` is the module `NAME` here, its tests named `NAME::test` (run one file's
//! with `cargo test --test integration NAME::`). A new file joins with one `mod NAME;` line
//! below; `every_test_file_is_a_module` fails until it has one. The helpers are `common`
//! (`use crate::common;` in a module).
//!
//! The tests share one process now: nothing here may change process-wide state (environment,
//! working directory, umask, signal dispositions) that another file's tests could see.

mod common;

mod agent;
mod agent_bounds;
mod agentscope;
mod bench_agent;
mod bench_distance;
mod bench_remote;
mod boot;
mod cli;
mod confinement;
mod conformance;
mod connect;
mod differential;
mod distance_feed;
mod distance_read;
mod distance_tree;
mod distance_write;
mod errors;
mod exec_edit;
mod exec_fastpath;
mod exec_grep;
mod exec_read_speed;
mod exec_remote;
mod exerciser;
mod lifecycle;
mod local_events;
mod memory_vs_agent;
mod mount;
mod offline_transports;
mod ownership;
mod peers;
mod posix;
mod queries;
mod refmodel;
mod rg_parity;
mod ssh;
mod ssh_life;
mod static_binary;
mod supervise;
mod tools;
mod transport_mounts;
mod untrusted_mount;
mod vectors_glob_grep_fuzzy;
mod vectors_scan_edit;
mod write_path;

/// Each `tests/*.rs` file is declared above: with `autotests = false`, cargo builds no file
/// of its own accord, and a file without its `mod` line would silently never run.
#[test]
fn every_test_file_is_a_module() {
    let root = common::repo_root().join("tests");
    let declared: std::collections::BTreeSet<String> = include_str!("integration.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let files: std::collections::BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".rs")
                .map(str::to_string)
        })
        .filter(|name| name != "integration")
        .collect();
    let missing: Vec<_> = files.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "tests/integration.rs needs `mod NAME;` for {missing:?}"
    );
}
