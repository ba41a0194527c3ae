//! A spawned task owned by an actor's state: dropping the state (stop, kill,
//! failure) or replacing the task aborts it, so no request outlives its owner.

use std::future::Future;

use tokio::task::{AbortHandle, JoinHandle};

pub struct OwnedTask(JoinHandle<()>);

impl OwnedTask {
    pub fn spawn(work: impl Future<Output = ()> + Send + 'static) -> Self {
        OwnedTask(tokio::spawn(work))
    }

    pub fn abort_handle(&self) -> AbortHandle {
        self.0.abort_handle()
    }
}

impl Drop for OwnedTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}
