//! Calls counted by operation: what a command cost the link, for `sbxfs ctl stats`
//! (`remote_calls_by_op`) and the benchmarks. A [`Layer`] that changes nothing else; a call
//! a layer beneath it repeats (a retry) counts once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::future::{BoxFuture, FutureExt};

use super::layer::{CallFn, CommitFn, Inner, Layer, Layered, Op};
use super::{Attr, CommitContent, RemotePath, Result};

/// The counts, shared with whoever reports them.
#[derive(Default, Debug)]
pub struct CallCounts(Mutex<BTreeMap<&'static str, u64>>);

impl CallCounts {
    fn count(&self, op: Op) {
        *self
            .0
            .lock()
            .expect("call counts")
            .entry(op.name())
            .or_default() += 1;
    }

    /// Each operation called at least once, with its count.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.0.lock().expect("call counts").clone()
    }
}

pub struct Counted {
    inner: Inner,
    counts: Arc<CallCounts>,
}

impl Counted {
    /// `remote` with its calls counted into the returned counts.
    pub fn wrap(remote: Inner) -> (Layered<Counted>, Arc<CallCounts>) {
        let counts = Arc::new(CallCounts::default());
        let layer = Counted {
            inner: remote,
            counts: counts.clone(),
        };
        (Layered::of(layer), counts)
    }
}

impl Layer for Counted {
    fn inner(&self) -> Result<Inner> {
        Ok(self.inner.clone())
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        _bytes: u64,
        call: CallFn<'a, T>,
    ) -> BoxFuture<'a, Result<T>> {
        self.counts.count(op);
        call(self.inner.clone())
    }

    fn commit<'a>(
        &'a self,
        _path: &'a RemotePath,
        content: CommitContent,
        call: CommitFn<'a>,
    ) -> BoxFuture<'a, Result<Attr>> {
        self.counts.count(Op::Commit);
        async move { call(self.inner.clone(), content).await }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::memory::MemoryRemote;
    use crate::remote::Remote;

    #[tokio::test]
    async fn each_call_is_counted_under_its_operation() {
        let memory = MemoryRemote::new();
        memory.sandbox().write("a", b"x").unwrap();
        let (remote, counts) = Counted::wrap(Arc::new(memory));
        let a = RemotePath::new(b"a".to_vec()).unwrap();
        remote.stat(&a).await.unwrap();
        remote.stat(&a).await.unwrap();
        let _ = remote.list(&RemotePath::root()).await.unwrap();
        assert!(remote
            .stat(&RemotePath::new(b"b".to_vec()).unwrap())
            .await
            .is_err());
        let got = counts.snapshot();
        assert_eq!(got.get("stat"), Some(&3));
        assert_eq!(got.get("list"), Some(&1));
        assert_eq!(got.len(), 2, "{got:?}");
    }
}
