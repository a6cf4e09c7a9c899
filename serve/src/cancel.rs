//! A run's cancel: asked by `DELETE /v1/runs/{id}` or by a waiting client
//! that went away, heard by the backend running it (spawn: SIGTERM to the
//! `jail run`'s group, which answers `cancelled` as it does any SIGTERM;
//! pool: the pool's `{"op": "cancel"}`, answered the same way). The run
//! still ends through its backend, so its result is recorded as any other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Asked once, heard by whoever waits, then and later.
#[derive(Default)]
pub struct Cancel {
    asked: AtomicBool,
    notify: Notify,
}

impl Cancel {
    pub fn ask(&self) {
        self.asked.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    /// Resolves once the cancel is asked (at once if it was).
    pub async fn wait(&self) {
        loop {
            let waiting = self.notify.notified();
            tokio::pin!(waiting);
            // Registered before the look: an ask in between still wakes us.
            waiting.as_mut().enable();
            if self.asked() {
                return;
            }
            waiting.await;
        }
    }
}

/// Asks the cancel when dropped armed: a waiting request's future dropped
/// because its client went away.
pub struct CancelOnDrop(Option<Arc<Cancel>>);

impl CancelOnDrop {
    pub fn new(cancel: Arc<Cancel>) -> CancelOnDrop {
        CancelOnDrop(Some(cancel))
    }

    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.ask();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_hears_an_ask_made_before_or_after_it_waits() {
        let c = Arc::new(Cancel::default());
        let waiter = tokio::spawn({
            let c = Arc::clone(&c);
            async move { c.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(CancelOnDrop::new(Arc::clone(&c)));
        tokio::time::timeout(Duration::from_secs(1), waiter).await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(1), c.wait()).await.unwrap();
        let quiet = Arc::new(Cancel::default());
        CancelOnDrop::new(Arc::clone(&quiet)).disarm();
        assert!(!quiet.asked());
    }
}
