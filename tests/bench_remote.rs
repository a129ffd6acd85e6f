//! Remote query benchmark (run by `scripts/bench/remote.sh`; ignored in the test suite).
//! sbxfs and sshfs each reach their server through the project's delaying proxy (5 ms each way,
//! bytes counted): `sbxfs grep` in the mount versus `rg` over either mount, and `sbxfs scan` of
//! lines near the end of a 200 MB log versus `sed -n` over either mount. Every measurement gets
//! a fresh mount (cold caches).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::sshfs::{mount_sshfs, start_sshd};
use common::*;
use sbxfs::proxy::Proxy;

const DELAY: Duration = Duration::from_millis(5);
const FILES: usize = 3000;

fn build_tree(dst: &Path) -> usize {
    let registry = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap()
        .join(".cargo/registry/src");
    let index = fs::read_dir(&registry)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut n = 0;
    let mut stack = vec![index.clone()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&d).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if n >= FILES {
                return n;
            }
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(&index).unwrap().to_path_buf();
                let out = dst.join(rel);
                fs::create_dir_all(out.parent().unwrap()).unwrap();
                fs::copy(e.path(), &out).unwrap();
                n += 1;
            }
        }
    }
    n
}

/// Run `cmd` in `dir`, returning (seconds, bytes that crossed `proxy`, stdout lines).
fn measure(proxy: &Proxy, dir: &Path, cmd: &str) -> (f64, u64, usize) {
    let before = proxy.counters.total();
    let t = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    (secs, proxy.counters.total() - before, lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: scripts/bench/remote.sh"]
async fn remote_queries_vs_sshfs() {
    let work = tempfile::tempdir().unwrap();
    let ws = work.path().join("ws");
    let files = build_tree(&ws.join("tree"));
    let log = ws.join("big.log");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(fs::File::create(&log).unwrap());
        let mut i = 0u64;
        let mut size = 0u64;
        while size < 200 << 20 {
            i += 1;
            let l = format!(
                "2026-11-29T12:00:00Z INFO request {i} served in {} ms\n",
                i % 997
            );
            size += l.len() as u64;
            f.write_all(l.as_bytes()).unwrap();
        }
    }
    let total_lines = fs::read_to_string(&log).unwrap().lines().count();
    let (start, end) = (total_lines - 60, total_lines - 10);

    let agent = AgentProcess::start(&ws);
    let agent_proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), agent.addr, DELAY)
        .await
        .unwrap();
    let sshd = start_sshd(work.path());
    let ssh_proxy = Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        ([127, 0, 0, 1], sshd.port).into(),
        DELAY,
    )
    .await
    .unwrap();
    let agent_url = format!("http://{}", agent_proxy.addr);

    let pattern = "unsafe fn";
    let mut rows = Vec::new();
    let sbxfs = sbxfs_bin().display().to_string();
    let mut run_sbxfs = |label: &str, cmd: &str, sub: &str| {
        let m = MountProcess::start_url(&agent_url, &agent.token, &[]);
        let r = measure(&agent_proxy, &m.dir.join(sub), cmd);
        rows.push((label.to_string(), r));
    };
    run_sbxfs(
        "`sbxfs grep` in the sbxfs mount (runs in the sandbox)",
        &format!("{sbxfs} grep -l '{pattern}'"),
        "tree",
    );
    run_sbxfs(
        "`rg -l` over the sbxfs mount",
        &format!("rg -l '{pattern}'"),
        "tree",
    );
    run_sbxfs(
        "`grep -rln` over the sbxfs mount",
        &format!("grep -rln '{pattern}' ."),
        "tree",
    );
    run_sbxfs(
        "`sbxfs scan` in the sbxfs mount",
        &format!("{sbxfs} scan big.log --start {start} --end {end}"),
        "",
    );
    run_sbxfs(
        "`sed -n` over the sbxfs mount",
        &format!("sed -n '{start},{end}p' big.log"),
        "",
    );
    let mut run_sshfs = |label: &str, cmd: &str, sub: &str, n: usize| {
        let m = mount_sshfs(
            &ws,
            ssh_proxy.addr.port(),
            &sshd.key,
            &work.path().join(format!("sshfs{n}")),
        );
        let r = measure(&ssh_proxy, &m.dir.join(sub), cmd);
        rows.push((label.to_string(), r));
    };
    run_sshfs(
        "`rg -l` over sshfs",
        &format!("rg -l '{pattern}'"),
        "tree",
        1,
    );
    run_sshfs(
        "`grep -rln` over sshfs",
        &format!("grep -rln '{pattern}' ."),
        "tree",
        2,
    );
    run_sshfs(
        "`sed -n` over sshfs",
        &format!("sed -n '{start},{end}p' big.log"),
        "",
        3,
    );

    println!("Tree: {files} files (cargo registry sources); log: 200 MiB, {total_lines} lines; each way {} ms.", DELAY.as_millis());
    println!();
    println!("| command | time (s) | bytes on the link | output lines |");
    println!("|---|---|---|---|");
    for (label, (secs, bytes, lines)) in &rows {
        println!("| {label} | {secs:.2} | {bytes} | {lines} |");
    }
    let get = |l: &str| rows.iter().find(|r| r.0.starts_with(l)).unwrap().1;
    let (g, rg_ssh) = (get("`sbxfs grep`"), get("`rg -l` over sshfs"));
    let (scan, sed_ssh) = (get("`sbxfs scan`"), get("`sed -n` over sshfs"));
    println!();
    println!(
        "sbxfs grep vs rg over sshfs: {:.0}× less time, {:.0}× fewer bytes",
        rg_ssh.0 / g.0,
        rg_ssh.1 as f64 / g.1 as f64
    );
    println!(
        "sbxfs scan vs sed over sshfs: {:.0}× less time, {:.0}× fewer bytes ({} bytes, {:.2} s)",
        sed_ssh.0 / scan.0,
        sed_ssh.1 as f64 / scan.1 as f64,
        scan.1,
        scan.0
    );
    assert_eq!(
        g.2, rg_ssh.2,
        "sbxfs grep and rg over sshfs found different files"
    );
}
