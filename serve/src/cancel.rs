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
        until(&self.notify, || self.asked()).await
    }

    /// Await `work` to its end; if the cancel is asked first, call `stop`
    /// once and go on awaiting it (a stopped run still ends with its
    /// result, `cancelled`).
    pub async fn until_done<T>(&self, work: impl std::future::Future<Output = T>, stop: impl FnOnce()) -> T {
        tokio::pin!(work);
        let mut stop = Some(stop);
        loop {
            tokio::select! {
                done = &mut work => return done,
                () = self.wait(), if stop.is_some() => {
                    if let Some(stop) = stop.take() {
                        stop();
                    }
                }
            }
        }
    }
}

/// Resolves once `holds()` does, looked at first and then after each
/// wake of `notify` (whose wakers call `notify_waiters` after the change).
pub async fn until(notify: &Notify, holds: impl Fn() -> bool) {
    loop {
        let waiting = notify.notified();
        tokio::pin!(waiting);
        // Registered before the look: a change in between still wakes us.
        waiting.as_mut().enable();
        if holds() {
            return;
        }
        waiting.await;
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

    #[tokio::test(flavor = "current_thread")]
    async fn work_asked_to_stop_is_stopped_once_and_still_awaited_to_its_end() {
        let c = Arc::new(Cancel::default());
        let stops = std::sync::atomic::AtomicUsize::new(0);
        let (tx, rx) = tokio::sync::oneshot::channel::<&str>();
        let asker = {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                c.ask();
                tokio::task::yield_now().await;
                c.ask();
                tokio::time::sleep(Duration::from_millis(20)).await;
                tx.send("its result").unwrap();
            })
        };
        let end = c.until_done(rx, || {
            stops.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(tokio::time::timeout(Duration::from_secs(1), end).await.unwrap().unwrap(), "its result");
        assert_eq!(stops.load(Ordering::SeqCst), 1);
        asker.await.unwrap();
        // Never asked: never stopped.
        let quiet = Cancel::default();
        assert_eq!(quiet.until_done(async { 7 }, || panic!("stopped")).await, 7);
    }
}
