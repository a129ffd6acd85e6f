//! `fuzzy`: a ranked "go to file" list, fzf's version 1 algorithm with its path scheme.
//!
//! Fixed and not configurable, so that every implementation ranks alike:
//! - the match is the first window of the candidate holding the query's characters in order,
//!   found by a forward scan, then narrowed from the back (fzf `FuzzyMatchV1`);
//! - it is scored with fzf's constants below; in the path scheme `/` is the only delimiter, a
//!   word boundary after `/` (or at the start) earns [`BONUS_BOUNDARY_DELIMITER`], and whitespace
//!   earns no more than any other boundary;
//! - case: smart, like fzf: a query with an uppercase letter matches case-sensitively, otherwise
//!   ASCII letters fold (non-ASCII letters only ever match themselves; no Latin normalisation,
//!   as `fzf --literal`);
//! - ranking: score (higher first), then the candidate's length in characters (shorter first),
//!   then walk order (sorted by name within each directory, as `rg --files --sort path`);
//! - an empty query matches every candidate with score 0, in walk order.
//!
//! Positions are 0-based character indexes into the path.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::walk::{walk_files, walk_source, TreeSource, WalkOptions};
use super::SearchError;

pub const SCORE_MATCH: i32 = 16;
pub const SCORE_GAP_START: i32 = -3;
pub const SCORE_GAP_EXTENSION: i32 = -1;
/// A word boundary: cancelled by a gap of about 8 characters (fzf's reasoning: the average word).
pub const BONUS_BOUNDARY: i32 = SCORE_MATCH / 2;
pub const BONUS_NON_WORD: i32 = SCORE_MATCH / 2;
/// camelCase and letter-to-digit transitions: a boundary without the separator character.
pub const BONUS_CAMEL_123: i32 = BONUS_BOUNDARY + SCORE_GAP_EXTENSION;
/// The least bonus a character in a consecutive run earns.
pub const BONUS_CONSECUTIVE: i32 = -(SCORE_GAP_START + SCORE_GAP_EXTENSION);
pub const BONUS_FIRST_CHAR_MULTIPLIER: i32 = 2;
/// Path scheme: a boundary after whitespace is worth a plain boundary...
pub const BONUS_BOUNDARY_WHITE: i32 = BONUS_BOUNDARY;
/// ...and one after `/` (or at the start of the path) one more.
pub const BONUS_BOUNDARY_DELIMITER: i32 = BONUS_BOUNDARY + 1;

/// Largest query accepted (characters): the algorithm is linear, but a query is typed.
pub const MAX_QUERY_CHARS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CharClass {
    White,
    NonWord,
    Delimiter,
    Lower,
    Upper,
    Letter,
    Number,
}

fn char_class(c: char) -> CharClass {
    if c.is_ascii() {
        match c {
            'a'..='z' => CharClass::Lower,
            'A'..='Z' => CharClass::Upper,
            '0'..='9' => CharClass::Number,
            ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' => CharClass::White,
            '/' => CharClass::Delimiter,
            _ => CharClass::NonWord,
        }
    } else if c.is_lowercase() {
        CharClass::Lower
    } else if c.is_uppercase() {
        CharClass::Upper
    } else if c.is_numeric() {
        CharClass::Number
    } else if c.is_alphabetic() {
        CharClass::Letter
    } else if c.is_whitespace() {
        CharClass::White
    } else {
        CharClass::NonWord
    }
}

fn bonus_for(prev: CharClass, class: CharClass) -> i32 {
    if class > CharClass::NonWord {
        match prev {
            CharClass::White => return BONUS_BOUNDARY_WHITE,
            CharClass::Delimiter => return BONUS_BOUNDARY_DELIMITER,
            CharClass::NonWord => return BONUS_BOUNDARY,
            _ => {}
        }
    }
    if (prev == CharClass::Lower && class == CharClass::Upper)
        || (prev != CharClass::Number && class == CharClass::Number)
    {
        return BONUS_CAMEL_123;
    }
    match class {
        CharClass::NonWord | CharClass::Delimiter => BONUS_NON_WORD,
        CharClass::White => BONUS_BOUNDARY_WHITE,
        _ => 0,
    }
}

/// A query ready to match: its characters, folded when matching is case-insensitive.
#[derive(Debug, Clone)]
pub struct Query {
    chars: Vec<char>,
    case_sensitive: bool,
}

impl Query {
    pub fn new(query: &str) -> Result<Self, SearchError> {
        let count = query.chars().count();
        if count > MAX_QUERY_CHARS {
            return Err(SearchError::LimitExceeded(format!(
                "query is {count} characters; the limit is {MAX_QUERY_CHARS}"
            )));
        }
        let case_sensitive = query.chars().any(char::is_uppercase);
        let chars = query
            .chars()
            .map(|c| {
                if case_sensitive {
                    c
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        Ok(Query {
            chars,
            case_sensitive,
        })
    }

    fn fold(&self, c: char) -> char {
        if self.case_sensitive {
            c
        } else {
            c.to_ascii_lowercase()
        }
    }

    /// Score `text`; `None` when it does not hold the query's characters in order.
    pub fn score(&self, text: &str) -> Option<(i32, Vec<usize>)> {
        if self.chars.is_empty() {
            return Some((0, Vec::new()));
        }
        let text: Vec<char> = text.chars().collect();
        // Forward: the first window that holds the whole query.
        let mut pidx = 0;
        let mut sidx = None;
        let mut eidx = None;
        for (i, &c) in text.iter().enumerate() {
            if self.fold(c) == self.chars[pidx] {
                sidx.get_or_insert(i);
                pidx += 1;
                if pidx == self.chars.len() {
                    eidx = Some(i + 1);
                    break;
                }
            }
        }
        let (mut sidx, eidx) = (sidx?, eidx?);
        // Backward: narrow the window's start to the last place the query still fits.
        let mut pidx = self.chars.len();
        for i in (sidx..eidx).rev() {
            if self.fold(text[i]) == self.chars[pidx - 1] {
                pidx -= 1;
                if pidx == 0 {
                    sidx = i;
                    break;
                }
            }
        }
        Some(self.score_window(&text, sidx, eidx))
    }

    fn score_window(&self, text: &[char], sidx: usize, eidx: usize) -> (i32, Vec<usize>) {
        let mut positions = Vec::with_capacity(self.chars.len());
        let (mut pidx, mut score, mut in_gap, mut consecutive, mut first_bonus) =
            (0, 0, false, 0, 0);
        let mut prev_class = if sidx > 0 {
            char_class(text[sidx - 1])
        } else {
            CharClass::Delimiter // path scheme: the start of a path counts as after a `/`
        };
        for (idx, &c) in text.iter().enumerate().take(eidx).skip(sidx) {
            let class = char_class(c);
            if pidx < self.chars.len() && self.fold(c) == self.chars[pidx] {
                positions.push(idx);
                score += SCORE_MATCH;
                let mut bonus = bonus_for(prev_class, class);
                if consecutive == 0 {
                    first_bonus = bonus;
                } else {
                    // A stronger boundary inside a run starts a new chunk.
                    if bonus >= BONUS_BOUNDARY && bonus > first_bonus {
                        first_bonus = bonus;
                    }
                    bonus = bonus.max(first_bonus).max(BONUS_CONSECUTIVE);
                }
                score += if pidx == 0 {
                    bonus * BONUS_FIRST_CHAR_MULTIPLIER
                } else {
                    bonus
                };
                in_gap = false;
                consecutive += 1;
                pidx += 1;
            } else {
                score += if in_gap {
                    SCORE_GAP_EXTENSION
                } else {
                    SCORE_GAP_START
                };
                in_gap = true;
                consecutive = 0;
                first_bonus = 0;
            }
            prev_class = class;
        }
        (score, positions)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuzzyMatch {
    pub path: String,
    pub score: i32,
    pub positions: Vec<usize>,
}

/// Rank `candidates` (in walk order) against `query`, best first, at most `limit`.
pub fn rank(query: &Query, candidates: &[String], limit: Option<usize>) -> Vec<FuzzyMatch> {
    let mut scored: Vec<(usize, usize, FuzzyMatch)> = candidates
        .iter()
        .enumerate()
        .filter_map(|(order, path)| {
            let (score, positions) = query.score(path)?;
            let len = path.trim().chars().count();
            Some((
                order,
                len,
                FuzzyMatch {
                    path: path.clone(),
                    score,
                    positions,
                },
            ))
        })
        .collect();
    if !query.chars.is_empty() {
        scored.sort_by(|a, b| {
            b.2.score
                .cmp(&a.2.score)
                .then(a.1.cmp(&b.1))
                .then(a.0.cmp(&b.0))
        });
    }
    scored
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
        .map(|(_, _, m)| m)
        .collect()
}

/// The files under `root` as grep's walk finds them, ranked against `query`.
pub fn fuzzy(
    root: &Path,
    query: &str,
    walk: &WalkOptions,
    limit: Option<usize>,
) -> Result<Vec<FuzzyMatch>, SearchError> {
    let query = Query::new(query)?;
    let mut candidates = Vec::new();
    walk_files(
        root,
        walk,
        |f| {
            candidates.push(f.relative);
            true
        },
        |_| {},
    )?;
    Ok(rank(&query, &candidates, limit))
}

/// [`fuzzy`] over a [`TreeSource`] (the agent's descriptor-confined workspace): `root` is the
/// searched directory's path in the source.
pub fn fuzzy_source(
    source: &dyn TreeSource,
    root: &[u8],
    query: &str,
    walk: &WalkOptions,
    limit: Option<usize>,
) -> Result<Vec<FuzzyMatch>, SearchError> {
    let query = Query::new(query)?;
    let mut candidates = Vec::new();
    walk_source(source, root, walk, |f| {
        candidates.push(f.relative);
        true
    })?;
    Ok(rank(&query, &candidates, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(q: &str, text: &str) -> Option<i32> {
        Query::new(q).unwrap().score(text).map(|s| s.0)
    }

    #[test]
    fn start_of_path_is_a_delimiter_boundary() {
        // "a" at the start: match + first-char bonus of a boundary after a delimiter.
        assert_eq!(
            score("a", "abc"),
            Some(SCORE_MATCH + BONUS_BOUNDARY_DELIMITER * BONUS_FIRST_CHAR_MULTIPLIER)
        );
    }

    #[test]
    fn consecutive_run_keeps_the_first_bonus() {
        // "ab" in "x/ab": a after '/', b consecutive (bonus = max(0, first, consecutive)).
        let first = BONUS_BOUNDARY_DELIMITER;
        assert_eq!(
            score("ab", "x/ab"),
            Some(2 * SCORE_MATCH + first * BONUS_FIRST_CHAR_MULTIPLIER + first)
        );
    }

    #[test]
    fn gaps_cost_start_then_extension() {
        // "ac" in "abbc": a at start, gap of two (start + extension), c with no bonus.
        assert_eq!(
            score("ac", "abbc"),
            Some(
                2 * SCORE_MATCH
                    + BONUS_BOUNDARY_DELIMITER * BONUS_FIRST_CHAR_MULTIPLIER
                    + SCORE_GAP_START
                    + SCORE_GAP_EXTENSION
            )
        );
    }

    #[test]
    fn camel_case_and_smart_case() {
        assert_eq!(score("B", "ab"), None);
        assert_eq!(
            score("B", "aB"),
            Some(SCORE_MATCH + BONUS_CAMEL_123 * BONUS_FIRST_CHAR_MULTIPLIER)
        );
        assert!(score("b", "aB").is_some());
    }

    #[test]
    fn window_is_narrowed_from_the_back() {
        let (_, pos) = Query::new("ab").unwrap().score("a_a_b").unwrap();
        assert_eq!(pos, vec![2, 4]);
    }
}
