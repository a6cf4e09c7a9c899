//! What the service keeps of a tenant's session: the live one (its
//! folder, its handle, its cells one at a time) and one ended by `DELETE`
//! (its closing result, for its artifacts). The handlers are sessions.rs;
//! the tenant's holdings (state.rs) keep these without needing them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A tenant's session as the service holds it, from the reservation of
/// its place to its end.
pub struct Served {
    pub dir: PathBuf,
    /// `None` while the session is being started (the place is reserved).
    pub handle: Option<String>,
    /// Each cell's wall time (sent with each cell): a pooled
    /// jail's own is the pool's, the longest any tenant may ask.
    pub cell_timeout: Duration,
    /// One cell at a time.
    pub busy: tokio::sync::Mutex<u64>,
}

impl Drop for Served {
    fn drop(&mut self) {
        // A reservation's folder belongs to the start that made it.
        if self.handle.is_some() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A session ended by `DELETE`: its closing result (the artifacts it
/// lists) and its folder (the output they are in), until it is forgotten.
pub struct Ended {
    pub session: Arc<Served>,
    pub closing: serde_json::Value,
}
