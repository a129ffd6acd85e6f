//! Agent throughput benchmark (run by `scripts/bench/agent.sh`; ignored in the test suite).
//! Ranged reads on loopback, directly and through a 5 ms-each-way proxy, side by side with
//! local `pread` of the same file; bytes on the wire for a 1-byte patch commit versus a
//! whole-file commit of a 256 MiB file.

use crate::common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use common::*;
use sbxfs::proxy::Proxy;
use sbxfs::remote::client::AgentClient;
use sbxfs::remote::*;

const FILE: u64 = 512 << 20;
const CHUNK: u32 = 1 << 20;

async fn read_all(client: Arc<AgentClient>, path: RemotePath, in_flight: usize, limit: u64) -> f64 {
    let start = Instant::now();
    let mut offset = 0u64;
    while offset < limit {
        let batch: Vec<_> = (0..in_flight as u64)
            .map(|i| offset + i * CHUNK as u64)
            .filter(|o| *o < limit)
            .map(|o| {
                let (c, p) = (client.clone(), path.clone());
                tokio::spawn(async move { c.read(&p, o, CHUNK).await.unwrap().data.len() })
            })
            .collect();
        for h in batch {
            offset += h.await.unwrap() as u64;
        }
    }
    limit as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: scripts/bench/agent.sh"]
async fn agent_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    fs::create_dir(&root).unwrap();
    let data: Vec<u8> = (0..FILE).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(root.join("big.bin"), &data).unwrap();
    drop(data);
    let agent = AgentProcess::start(&root);
    let path = RemotePath::new(b"big.bin".to_vec()).unwrap();

    // Local pread of the same (cached) file: the ceiling.
    let f = fs::File::open(root.join("big.bin")).unwrap();
    let mut buf = vec![0u8; CHUNK as usize];
    let start = Instant::now();
    let mut off = 0;
    while off < FILE {
        off += f.read_at(&mut buf, off).unwrap() as u64;
    }
    let local = FILE as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64();

    let direct = Arc::new(agent.client());
    let d1 = read_all(direct.clone(), path.clone(), 1, FILE).await;
    let d8 = read_all(direct.clone(), path.clone(), 8, FILE).await;
    let proxy = Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        agent.addr,
        Duration::from_millis(5),
    )
    .await
    .unwrap();
    let far = Arc::new(AgentClient::new(&format!("http://{}", proxy.addr), &agent.token).unwrap());
    let far_limit = 128 << 20;
    let f1 = read_all(far.clone(), path.clone(), 1, far_limit).await;
    let f8 = read_all(far.clone(), path.clone(), 8, far_limit).await;

    // Commits of a 256 MiB file, counted on a proxy without delay.
    let counted = Proxy::start("127.0.0.1:0".parse().unwrap(), agent.addr, Duration::ZERO)
        .await
        .unwrap();
    let c = AgentClient::new(&format!("http://{}", counted.addr), &agent.token).unwrap();
    let target = RemotePath::new(b"commit.bin".to_vec()).unwrap();
    let g = fs::File::create(root.join("commit.bin")).unwrap();
    g.set_len(256 << 20).unwrap();
    drop(g);
    let base = c.stat(&target).await.unwrap().version;
    let before = counted.counters.total();
    let t = Instant::now();
    let patch = CommitContent::Patch {
        cut: u64::MAX,
        new_len: 256 << 20,
        ranges: vec![(1 << 27, Bytes::from_static(b"x"))],
    };
    c.commit(
        &target,
        patch,
        CommitOptions {
            base: Some(base),
            create_mode: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (patch_bytes, patch_s) = (counted.counters.total() - before, t.elapsed().as_secs_f64());
    let before = counted.counters.total();
    let t = Instant::now();
    let src = tokio::fs::File::open(root.join("commit.bin"))
        .await
        .unwrap();
    c.commit(
        &target,
        CommitContent::Whole(Box::new(src)),
        CommitOptions::default(),
    )
    .await
    .unwrap();
    let (whole_bytes, whole_s) = (counted.counters.total() - before, t.elapsed().as_secs_f64());

    println!("| ranged reads of a 512 MiB file, 1 MiB each | MB/s | ÷ local pread |");
    println!("|---|---|---|");
    println!("| local `pread` (page cache), the ceiling | {local:.0} | 1.00 |");
    println!(
        "| agent on loopback, 1 in flight | {d1:.0} | {:.2} |",
        d1 / local
    );
    println!(
        "| agent on loopback, 8 in flight | {d8:.0} | {:.2} |",
        d8 / local
    );
    println!(
        "| agent behind a 5 ms-each-way proxy, 1 in flight | {f1:.0} | {:.3} |",
        f1 / local
    );
    println!(
        "| agent behind a 5 ms-each-way proxy, 8 in flight | {f8:.0} | {:.3} |",
        f8 / local
    );
    println!();
    println!("| commit to a 256 MiB file | bytes on the wire | time (s) |");
    println!("|---|---|---|");
    println!("| 1-byte patch (copy_file_range of the base in the sandbox) | {patch_bytes} | {patch_s:.2} |");
    println!("| whole file | {whole_bytes} | {whole_s:.2} |");
    println!(
        "| ratio | {:.0}× fewer bytes | |",
        whole_bytes as f64 / patch_bytes as f64
    );
    assert!(patch_bytes < 4096 && whole_bytes > 256 << 20);
}
