//! `FaultyRemote`: any `Remote`, with faults injected on demand.
//!
//! Some failures cannot be had from a real sandbox when a test wants them: an answer that never
//! comes, a stream cut halfway, an error on the third read only. This wrapper produces them
//! around a real backend (usually [`super::memory::MemoryRemote`]), so the code under test meets
//! the fault through the same trait it always uses; nothing else in the world is mocked.
//!
//! A test holds the [`FaultControl`] (a cheap clone of a shared handle) and changes the plan
//! while calls are in flight. Per operation ([`Op`]) the plan has a latency and a queue of
//! [`Rule`]s: each call takes the rule at the front (a rule for `n` calls stays until used `n`
//! times; a rule for every call stays until cleared), so "fail once, then hang" is two rules.
//! Every call is counted, faulted or not, so a test can assert that no remote call happened.
//!
//! Cancellation: a hung call waits on a watch channel and touches nothing else, so dropping its
//! future (a timeout, a cancelled request) leaves no trace but the call count; the inner remote
//! is only called once the fault lets the call through.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{self, BoxStream, StreamExt};
use tokio::io::{AsyncRead, ReadBuf};

use super::layer::{CallFn, CommitFn, Inner, Items, Layer, Layered};
use super::*;

pub use super::layer::Op;

/// What happens to a call a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer this error; the inner remote is not called.
    Error(RemoteError),
    /// Never answer, until [`FaultControl::release`] (then the call goes through) or until
    /// the call's future is dropped.
    Hang,
    /// Streams (`tree`, `grep`, `watch`): pass `after` items, then end with a `Transport`
    /// error. A whole-file `commit`: the inner remote reads `after` bytes of the body, then
    /// the body fails; the call answers a `Transport` error. A patch commit fails with
    /// `Transport` before reaching the inner remote. Other operations: as `LoseAnswer`.
    Cut { after: usize },
    /// The inner remote does the operation, but its answer is lost: the caller gets a
    /// `Transport` error (a request that reached the sandbox, a connection that did not last).
    LoseAnswer,
    /// The inner remote does the operation at once, and its answer arrives this much later
    /// (what the sandbox said then, not what it holds when the caller reads it: a reply that
    /// crossed a change on its way). Streams are answered at once.
    Late(Duration),
    /// Streams: each item comes this much after the one before (a peer that keeps the stream
    /// open but barely moves it). Other operations: as `Late`.
    Trickle(Duration),
}

/// A fault and how many more calls it applies to (`None`: every call until cleared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub fault: Fault,
    pub remaining: Option<usize>,
}

#[derive(Default)]
struct Plan {
    latency: HashMap<Op, Duration>,
    rules: HashMap<Op, VecDeque<Rule>>,
    calls: HashMap<Op, u64>,
}

struct Shared {
    plan: Mutex<Plan>,
    /// Bumped by `release`: every call hung before the bump goes through.
    released: tokio::sync::watch::Sender<u64>,
    hanging: AtomicUsize,
}

/// The test's handle on a [`FaultyRemote`]'s plan. Clones share the plan.
#[derive(Clone)]
pub struct FaultControl {
    shared: Arc<Shared>,
}

/// The fault [`Layer`]: every call passes to `inner`, except as its [`FaultControl`] says.
pub struct Faults<R> {
    inner: Arc<R>,
    control: FaultControl,
}

/// A `Remote` with faults injected on demand.
pub type FaultyRemote<R> = Layered<Faults<R>>;

impl<R: Remote + 'static> Layered<Faults<R>> {
    pub fn new(inner: R) -> Self {
        let (released, _) = tokio::sync::watch::channel(0);
        Layered::of(Faults {
            inner: Arc::new(inner),
            control: FaultControl {
                shared: Arc::new(Shared {
                    plan: Mutex::new(Plan::default()),
                    released,
                    hanging: AtomicUsize::new(0),
                }),
            },
        })
    }

    /// The handle that changes the plan (and reads the call counts) at run time.
    pub fn control(&self) -> FaultControl {
        self.layer().control.clone()
    }

    pub fn inner(&self) -> &R {
        &self.layer().inner
    }
}

impl FaultControl {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.shared.plan.lock().expect("fault plan lock")
    }

    /// Queue a fault for the next `times` calls of `op` (`None`: every call until cleared).
    pub fn inject(&self, op: Op, fault: Fault, times: Option<usize>) {
        if times == Some(0) {
            return;
        }
        self.plan().rules.entry(op).or_default().push_back(Rule {
            fault,
            remaining: times,
        });
    }

    /// The next call of `op` answers `error`.
    pub fn fail_once(&self, op: Op, error: RemoteError) {
        self.inject(op, Fault::Error(error), Some(1));
    }

    /// The next `n` calls of `op` answer `error`.
    pub fn fail_times(&self, op: Op, error: RemoteError, n: usize) {
        self.inject(op, Fault::Error(error), Some(n));
    }

    /// Every call of `op` answers `error`, until cleared.
    pub fn fail_always(&self, op: Op, error: RemoteError) {
        self.inject(op, Fault::Error(error), None);
    }

    /// Every call of `op` hangs, until [`FaultControl::release`] or [`FaultControl::clear`].
    pub fn hang(&self, op: Op) {
        self.inject(op, Fault::Hang, None);
    }

    /// The next call of `op` hangs.
    pub fn hang_once(&self, op: Op) {
        self.inject(op, Fault::Hang, Some(1));
    }

    /// The next call of `op` is cut after `after` items (or body bytes): see [`Fault::Cut`].
    pub fn cut_once(&self, op: Op, after: usize) {
        self.inject(op, Fault::Cut { after }, Some(1));
    }

    /// The next call of `op` is done by the inner remote, but answers a `Transport` error.
    pub fn lose_answer_once(&self, op: Op) {
        self.inject(op, Fault::LoseAnswer, Some(1));
    }

    /// The next `n` calls of `op` are done at once and answered `late`.
    pub fn answer_late(&self, op: Op, late: Duration, n: usize) {
        self.inject(op, Fault::Late(late), Some(n));
    }

    /// Every call of `op` from now on trickles: a stream's items come `gap` apart.
    pub fn trickle(&self, op: Op, gap: Duration) {
        self.inject(op, Fault::Trickle(gap), None);
    }

    /// Wait `latency` before every call of `op` (zero removes it).
    pub fn set_latency(&self, op: Op, latency: Duration) {
        let mut plan = self.plan();
        if latency.is_zero() {
            plan.latency.remove(&op);
        } else {
            plan.latency.insert(op, latency);
        }
    }

    /// The same latency before every operation.
    pub fn set_latency_all(&self, latency: Duration) {
        for op in Op::ALL {
            self.set_latency(op, latency);
        }
    }

    /// Let every hung call through (to the inner remote) and drop every `Hang` rule.
    pub fn release(&self) {
        let mut plan = self.plan();
        for rules in plan.rules.values_mut() {
            rules.retain(|r| r.fault != Fault::Hang);
        }
        self.shared.released.send_modify(|g| *g += 1);
    }

    /// Drop every rule and the latency of `op` (calls already hung stay hung).
    pub fn clear(&self, op: Op) {
        let mut plan = self.plan();
        plan.rules.remove(&op);
        plan.latency.remove(&op);
    }

    /// Drop every rule and latency of every operation.
    pub fn clear_all(&self) {
        let mut plan = self.plan();
        plan.rules.clear();
        plan.latency.clear();
    }

    /// The rules still queued for `op`.
    pub fn rules(&self, op: Op) -> Vec<Rule> {
        self.plan()
            .rules
            .get(&op)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Calls of `op` so far (faulted or not).
    pub fn calls(&self, op: Op) -> u64 {
        self.plan().calls.get(&op).copied().unwrap_or(0)
    }

    /// Calls of every operation so far.
    pub fn total_calls(&self) -> u64 {
        self.plan().calls.values().sum()
    }

    pub fn reset_counts(&self) {
        self.plan().calls.clear();
    }

    /// Calls hung right now (a dropped call no longer counts).
    pub fn hanging(&self) -> usize {
        self.shared.hanging.load(Ordering::SeqCst)
    }

    /// Count the call, take its rule, wait its latency and apply the fault: answers what is
    /// left to do after the inner call.
    async fn begin(&self, op: Op) -> Result<After> {
        let (latency, fault, generation) = {
            let mut plan = self.plan();
            // Read under the plan lock, which `release` holds while it bumps it: a call that
            // took a `Hang` rule before a release is released by it.
            let generation = *self.shared.released.borrow();
            *plan.calls.entry(op).or_default() += 1;
            let latency = plan.latency.get(&op).copied();
            let rules = plan.rules.entry(op).or_default();
            let fault = match rules.front_mut() {
                Some(rule) => {
                    let fault = rule.fault.clone();
                    if let Some(n) = &mut rule.remaining {
                        *n -= 1;
                        if *n == 0 {
                            rules.pop_front();
                        }
                    }
                    Some(fault)
                }
                None => None,
            };
            (latency, fault, generation)
        };
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        match fault {
            None => Ok(After::Answer),
            Some(Fault::Error(e)) => Err(e),
            Some(Fault::Hang) => {
                self.wait_for_release(generation).await;
                Ok(After::Answer)
            }
            Some(Fault::Cut { after }) => Ok(After::Cut(after)),
            Some(Fault::LoseAnswer) => Ok(After::Lose),
            Some(Fault::Late(d)) => Ok(After::Late(d)),
            Some(Fault::Trickle(d)) => Ok(After::Trickle(d)),
        }
    }

    async fn wait_for_release(&self, generation: u64) {
        let mut rx = self.shared.released.subscribe();
        let _hung = HangGuard::new(&self.shared.hanging);
        while *rx.borrow_and_update() == generation {
            if rx.changed().await.is_err() {
                // The wrapper is gone; nothing can release this call.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Counts a hung call while its future lives.
struct HangGuard<'a>(&'a AtomicUsize);

impl<'a> HangGuard<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        HangGuard(n)
    }
}

impl Drop for HangGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What to do with the inner call's answer.
#[derive(Clone, Copy, Debug)]
enum After {
    Answer,
    Cut(usize),
    Lose,
    Late(Duration),
    Trickle(Duration),
}

fn lost(op: Op) -> RemoteError {
    RemoteError::Transport(format!("{op:?}: the answer was lost (injected)"))
}

fn cut(op: Op, after: usize) -> RemoteError {
    RemoteError::Transport(format!("{op:?}: cut after {after} (injected)"))
}

impl After {
    async fn answer<T>(self, op: Op, r: Result<T>) -> Result<T> {
        match self {
            After::Answer => r,
            After::Late(d) | After::Trickle(d) => {
                tokio::time::sleep(d).await;
                r
            }
            After::Cut(_) | After::Lose => r.and(Err(lost(op))),
        }
    }

    fn stream<T: Send + 'static>(
        self,
        op: Op,
        r: Result<BoxStream<'static, Result<T>>>,
    ) -> Result<BoxStream<'static, Result<T>>> {
        match self {
            After::Answer | After::Late(_) => r,
            After::Trickle(d) => Ok(r?
                .then(move |item| async move {
                    tokio::time::sleep(d).await;
                    item
                })
                .boxed()),
            After::Lose => r.and(Err(lost(op))),
            After::Cut(after) => {
                let s = r?;
                Ok(s.take(after)
                    .chain(stream::once(async move { Err(cut(op, after)) }))
                    .boxed())
            }
        }
    }
}

/// A commit body that yields `left` bytes of the real one, then fails.
struct CutReader {
    inner: Box<dyn AsyncRead + Send + Unpin>,
    left: usize,
}

impl AsyncRead for CutReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.left == 0 {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "commit body cut (injected)",
            )));
        }
        let want = buf.remaining().min(self.left);
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(want));
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, &mut limited);
        if let std::task::Poll::Ready(Ok(())) = &poll {
            let n = limited.filled().len();
            if n == 0 && want > 0 {
                // The body ended before the cut: it is cut at its end instead.
                return std::task::Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "commit body cut at its end (injected)",
                )));
            }
            buf.advance(n);
            self.left -= n;
        }
        poll
    }
}

impl<R: Remote + 'static> Layer for Faults<R> {
    fn inner(&self) -> Result<Inner> {
        Ok(self.inner.clone())
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        _bytes: u64,
        call: CallFn<'a, T>,
    ) -> BoxFuture<'a, Result<T>> {
        async move {
            let after = self.control.begin(op).await?;
            after.answer(op, call(self.inner.clone()).await).await
        }
        .boxed()
    }

    fn stream<'a, T: Send + 'static>(
        &'a self,
        op: Op,
        call: CallFn<'a, Items<T>>,
    ) -> BoxFuture<'a, Result<Items<T>>> {
        async move {
            let after = self.control.begin(op).await?;
            after.stream(op, call(self.inner.clone()).await)
        }
        .boxed()
    }

    fn commit<'a>(
        &'a self,
        _path: &'a RemotePath,
        content: CommitContent,
        call: CommitFn<'a>,
    ) -> BoxFuture<'a, Result<Attr>> {
        async move {
            let after = self.control.begin(Op::Commit).await?;
            match (after, content) {
                (After::Cut(n), CommitContent::Whole(body)) => {
                    let body = CutReader {
                        inner: body,
                        left: n,
                    };
                    let r = call(self.inner.clone(), CommitContent::Whole(Box::new(body))).await;
                    // Whatever the inner remote made of the broken body, the call failed.
                    Err(match r {
                        Err(RemoteError::Transport(m)) => RemoteError::Transport(m),
                        _ => cut(Op::Commit, n),
                    })
                }
                (After::Cut(n), CommitContent::Patch { .. }) => Err(cut(Op::Commit, n)),
                (after, content) => {
                    after
                        .answer(Op::Commit, call(self.inner.clone(), content).await)
                        .await
                }
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::memory::MemoryRemote;

    fn rp(s: &str) -> RemotePath {
        RemotePath::new(s.as_bytes().to_vec()).unwrap()
    }

    fn faulty() -> (FaultyRemote<MemoryRemote>, FaultControl) {
        let m = MemoryRemote::new();
        m.sandbox().mkdir_all("d/e").unwrap();
        for f in ["a", "b", "d/c", "d/e/f"] {
            m.sandbox().write(f, b"content").unwrap();
        }
        let f = FaultyRemote::new(m);
        let c = f.control();
        (f, c)
    }

    #[tokio::test]
    async fn an_error_once_then_success_and_every_call_is_counted() {
        let (f, c) = faulty();
        c.fail_once(Op::Stat, RemoteError::TimedOut("x".into()));
        assert_eq!(
            f.stat(&rp("a")).await,
            Err(RemoteError::TimedOut("x".into()))
        );
        assert_eq!(f.stat(&rp("a")).await.unwrap().size, 7);
        assert_eq!((c.calls(Op::Stat), c.calls(Op::Read)), (2, 0));
        assert!(c.rules(Op::Stat).is_empty());
    }

    #[tokio::test]
    async fn errors_n_times_then_always_until_cleared() {
        let (f, c) = faulty();
        c.fail_times(Op::Read, RemoteError::Transport("t".into()), 2);
        c.fail_always(Op::Read, RemoteError::NoSpace("n".into()));
        assert!(matches!(
            f.read(&rp("a"), 0, 3).await,
            Err(RemoteError::Transport(_))
        ));
        assert!(matches!(
            f.read(&rp("a"), 0, 3).await,
            Err(RemoteError::Transport(_))
        ));
        for _ in 0..3 {
            assert!(matches!(
                f.read(&rp("a"), 0, 3).await,
                Err(RemoteError::NoSpace(_))
            ));
        }
        c.clear(Op::Read);
        assert_eq!(&f.read(&rp("a"), 0, 3).await.unwrap().data[..], b"con");
        assert_eq!(c.total_calls(), 6);
        c.reset_counts();
        assert_eq!(c.total_calls(), 0);
    }

    #[tokio::test]
    async fn a_hung_call_dropped_leaves_no_trace() {
        let (f, c) = faulty();
        c.hang_once(Op::Unlink);
        let a = rp("a");
        let call = f.unlink(&a);
        let timed_out = tokio::time::timeout(Duration::from_millis(50), call).await;
        assert!(timed_out.is_err(), "the call hung");
        // The timeout dropped the future: nothing hangs, the file was never touched.
        assert_eq!(c.hanging(), 0);
        assert!(f.inner().sandbox().exists("a"));
        f.unlink(&rp("a")).await.unwrap();
        assert!(!f.inner().sandbox().exists("a"));
        assert_eq!(c.calls(Op::Unlink), 2);
    }

    #[tokio::test]
    async fn a_released_hang_goes_through() {
        let (f, c) = faulty();
        let f = Arc::new(f);
        c.hang(Op::Mkdir);
        let f2 = f.clone();
        let call = tokio::spawn(async move { f2.mkdir(&rp("new"), 0o700).await });
        while c.hanging() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(!f.inner().sandbox().exists("new"));
        c.release();
        assert_eq!(call.await.unwrap().unwrap().mode, 0o700);
        assert_eq!(c.hanging(), 0);
        assert!(c.rules(Op::Mkdir).is_empty(), "release drops hang rules");
    }

    #[tokio::test]
    async fn latency_delays_only_its_operation() {
        let (f, c) = faulty();
        c.set_latency(Op::Stat, Duration::from_millis(80));
        let t = std::time::Instant::now();
        f.list(&RemotePath::root()).await.unwrap();
        assert!(t.elapsed() < Duration::from_millis(80));
        let t = std::time::Instant::now();
        f.stat(&rp("a")).await.unwrap();
        assert!(t.elapsed() >= Duration::from_millis(80));
    }

    #[tokio::test]
    async fn a_cut_tree_ends_with_a_transport_error() {
        let (f, c) = faulty();
        c.cut_once(Op::Tree, 2);
        let items: Vec<Result<TreeEntry>> =
            f.tree(&RemotePath::root()).await.unwrap().collect().await;
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].as_ref().unwrap().path.0, b"a");
        assert!(matches!(items[2], Err(RemoteError::Transport(_))));
        let whole: Vec<_> = f.tree(&RemotePath::root()).await.unwrap().collect().await;
        assert_eq!(whole.len(), 6, "only once");
    }

    #[tokio::test]
    async fn a_cut_commit_body_leaves_the_target_untouched() {
        let (f, c) = faulty();
        for after in [0, 3, 1000] {
            c.cut_once(Op::Commit, after);
            let body = CommitContent::Whole(Box::new(std::io::Cursor::new(b"replaced".to_vec())));
            let r = f.commit(&rp("a"), body, CommitOptions::default()).await;
            assert!(matches!(r, Err(RemoteError::Transport(_))), "{r:?}");
            assert_eq!(f.inner().sandbox().read("a").unwrap(), b"content");
        }
    }

    #[tokio::test]
    async fn a_lost_answer_still_happened() {
        let (f, c) = faulty();
        c.lose_answer_once(Op::Rename);
        let r = f.rename(&rp("a"), &rp("z"), RenameMode::Replace).await;
        assert!(matches!(r, Err(RemoteError::Transport(_))));
        assert!(f.inner().sandbox().exists("z") && !f.inner().sandbox().exists("a"));
    }
}
