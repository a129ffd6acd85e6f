//! Reading a file over ssh without the agent (`?agent=no`, the exec scripts): 1 MiB ranges
//! with 16 in flight, as the mount's read-ahead asks for them, come back whole and equal to
//! the file; the throughput and the bytes that crossed are printed (behind no delay: the
//! scripts' own cost).

use crate::common;

use std::time::Instant;

use futures_util::StreamExt;

use common::sshbox::SshBox;
use sbxfs::remote::connect::connect;
use sbxfs::remote::RemotePath;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_ranges_over_ssh_scripts_come_back_whole() {
    if common::require_tool("sshd").is_none() && !std::path::Path::new("/usr/sbin/sshd").exists() {
        return;
    }
    let sb = SshBox::start();
    let size: usize = 16 * 1024 * 1024;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4093) as u8).collect();
    std::fs::write(sb.root.join("big.bin"), &data).unwrap();
    let c = connect(&sb.url("?agent=no"), &sb.options()).await.unwrap();
    assert_eq!(c.transport, "ssh+scripts");
    let r = c.remote.clone();
    let path = RemotePath::new(b"big.bin".to_vec()).unwrap();
    r.stat(&path).await.unwrap();
    for len in [1u32, 1024 * 1024, 4 * 1024 * 1024] {
        let t = Instant::now();
        let got = r.read(&path, 0, len).await.unwrap();
        assert_eq!(got.data.len(), len as usize);
        println!(
            "one read of {len} bytes: {:.3} s",
            t.elapsed().as_secs_f64()
        );
    }
    const RUN: usize = 1024 * 1024;
    let start = Instant::now();
    let parts: Vec<(usize, bytes::Bytes)> = futures_util::stream::iter((0..size).step_by(RUN))
        .map(|off| {
            let r = r.clone();
            let path = path.clone();
            async move {
                let got = r.read(&path, off as u64, RUN as u32).await.unwrap();
                (off, got.data)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let secs = start.elapsed().as_secs_f64();
    let mut back = vec![0u8; size];
    for (off, d) in parts {
        assert_eq!(d.len(), RUN);
        back[off..off + RUN].copy_from_slice(&d);
    }
    assert!(back == data, "the bytes read differ from the file");
    println!(
        "16 MiB in 1 MiB ranges, 16 in flight: {secs:.2} s, {:.1} MB/s",
        size as f64 / secs / 1e6
    );
}

/// A cold `cat` of 16 MiB through a mount over `?agent=no`: equal bytes; the time printed.
#[test]
fn a_cold_cat_through_a_scripts_mount_reads_the_file() {
    cold_cat(None);
}

/// The same behind the project's delaying proxy (5 ms each way, as the distance benchmark).
#[test]
fn a_cold_cat_through_a_scripts_mount_5ms_away_reads_the_file() {
    cold_cat(Some(std::time::Duration::from_millis(5)));
}

fn cold_cat(delay: Option<std::time::Duration>) {
    if !std::path::Path::new("/usr/sbin/sshd").exists()
        || !std::path::Path::new("/dev/fuse").exists()
    {
        return;
    }
    let sb = SshBox::start();
    let size: usize = 16 * 1024 * 1024;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4093) as u8).collect();
    std::fs::write(sb.root.join("big.bin"), &data).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _proxy = delay.map(|d| {
        let sshd = sb.sshd.as_ref().unwrap();
        let p = rt
            .block_on(sbxfs::proxy::Proxy::start(
                "127.0.0.1:0".parse().unwrap(),
                ([127, 0, 0, 1], sshd.port).into(),
                d,
            ))
            .unwrap();
        common::sshbox::write_config(&sb.config, p.addr.port(), &sshd.key);
        p
    });
    let config = sb.config.display().to_string();
    let m = common::MountProcess::start_url(&sb.url("?agent=no"), "unused", &["-F", &config]);
    let start = Instant::now();
    let back = std::fs::read(m.dir.join("big.bin")).unwrap();
    let secs = start.elapsed().as_secs_f64();
    let moved = _proxy.as_ref().map(|p| p.counters.total());
    assert!(back == data, "the bytes read differ from the file");
    println!("bytes through the proxy (mount included): {moved:?}");
    println!(
        "cold cat of 16 MiB ({delay:?} each way): {secs:.2} s, {:.1} MB/s",
        size as f64 / secs / 1e6
    );
}
