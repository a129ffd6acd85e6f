//! grep, glob and fuzzy over a tree held in memory ([`TreeSource`]), answered as the agent
//! answers them over its disk (the same pure functions, the agent's caps): a transport without
//! an agent searches the snapshot it listed ([`crate::search::snapshot`]), and the memory
//! backend its tree.

use futures_util::stream::{self, BoxStream, StreamExt};

use super::{FuzzyRequest, GrepEvent, RemoteError, RemotePath, Result};
use crate::agent::{MAX_FUZZY_RESULTS, MAX_GLOB_RESULTS, MAX_GREP_BYTES, MAX_GREP_RESULTS};
use crate::search::fuzzy::FuzzyMatch;
use crate::search::grep::GrepOptions;
use crate::search::walk::{walk_source, TreeSource};

/// Where a query of `path` runs: the path with its symlinks followed, inside the tree.
pub fn query_root(source: &dyn TreeSource, path: &RemotePath) -> Result<Vec<u8>> {
    source
        .resolve(path.as_bytes())
        .ok_or_else(|| RemoteError::NotFound(path.display()))
}

/// grep's events, whole (the caps bound them); a bad pattern is an error before any event.
pub fn grep(
    source: &dyn TreeSource,
    path: &RemotePath,
    mut opts: GrepOptions,
) -> Result<BoxStream<'static, Result<GrepEvent>>> {
    opts.max_results = Some(
        opts.max_results
            .unwrap_or(MAX_GREP_RESULTS)
            .min(MAX_GREP_RESULTS),
    );
    opts.max_bytes = Some(opts.max_bytes.unwrap_or(MAX_GREP_BYTES).min(MAX_GREP_BYTES));
    crate::search::grep::build_matcher(&opts)?;
    let root = query_root(source, path)?;
    let mut events = Vec::new();
    let result = crate::search::grep::grep_source_items(source, &root, &opts, &mut |item| {
        events.push(Ok(GrepEvent::from(item)));
        true
    });
    events.push(match result {
        Ok(summary) => Ok(GrepEvent::Summary {
            truncated: summary.truncated,
            summary,
        }),
        Err(e) => Err(e.into()),
    });
    Ok(stream::iter(events).boxed())
}

pub fn glob(source: &dyn TreeSource, path: &RemotePath, pattern: &str) -> Result<Vec<String>> {
    let root = query_root(source, path)?;
    let mut paths = crate::search::glob::glob_source(source, &root, pattern)?;
    paths.truncate(MAX_GLOB_RESULTS);
    Ok(paths)
}

pub fn fuzzy(
    source: &dyn TreeSource,
    path: &RemotePath,
    req: FuzzyRequest,
) -> Result<Vec<FuzzyMatch>> {
    let query = crate::search::fuzzy::Query::new(&req.query)?;
    let root = query_root(source, path)?;
    let mut candidates = Vec::new();
    walk_source(source, &root, &req.walk, |f| {
        candidates.push(f.relative);
        true
    })?;
    let limit = req
        .limit
        .unwrap_or(MAX_FUZZY_RESULTS)
        .min(MAX_FUZZY_RESULTS);
    Ok(crate::search::fuzzy::rank(&query, &candidates, Some(limit)))
}
