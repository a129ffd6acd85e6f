//! The `agentscope` transport (being written).

use super::connect::{ConnectOptions, Connected};
use super::{RemoteError, Result};

pub async fn connect(url: &str, _opts: &ConnectOptions) -> Result<Connected> {
    Err(RemoteError::Unsupported(format!(
        "{url}: the agentscope transport is being written"
    )))
}
