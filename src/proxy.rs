//! A small TCP proxy for tests and benchmarks: it stands between a client and a server on
//! loopback, holds each direction's bytes for a delay (a far-away sandbox, since this kernel has
//! no `netem`), counts the bytes that cross it, and can cut the link (traffic is dropped and
//! connections are held open, as a dead network does).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What crossed the proxy, and its cut switch.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    /// Client to server.
    pub up: AtomicU64,
    /// Server to client.
    pub down: AtomicU64,
    pub connections: AtomicU64,
    pub cut: AtomicBool,
}

impl ProxyCounters {
    pub fn total(&self) -> u64 {
        self.up.load(Ordering::Relaxed) + self.down.load(Ordering::Relaxed)
    }
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub counters: Arc<ProxyCounters>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Listen on `listen` (port 0 picks one) and forward to `upstream`, each direction's bytes
    /// held for `delay`.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        delay: Duration,
    ) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(ProxyCounters::default());
        let c = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                c.connections.fetch_add(1, Ordering::Relaxed);
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = tokio::spawn(pump(cr, sw, delay, c.clone(), true));
                    let down = tokio::spawn(pump(sr, cw, delay, c, false));
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(Proxy {
            addr,
            counters,
            task,
        })
    }

    pub fn set_cut(&self, cut: bool) {
        self.counters.cut.store(cut, Ordering::Relaxed);
    }
}

/// Copy one direction: read, stamp, and let a writer release each chunk once its delay passed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    counters: Arc<ProxyCounters>,
    up: bool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, data)) = rx.recv().await {
            tokio::time::sleep_until(at + delay).await;
            if to.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if counters.cut.load(Ordering::Relaxed) {
            continue; // a cut link loses what is sent into it
        }
        let counter = if up { &counters.up } else { &counters.down };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}
