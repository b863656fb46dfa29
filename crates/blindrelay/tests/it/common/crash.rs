//! Starting a node without waiting for it, for tests that kill it while it starts.

use super::Net;

impl Net {
    /// Starts node `i` (stopped) with `extra` arguments and returns at once.
    pub fn start_detached(&mut self, i: usize, extra: &[&str]) {
        self.spawn_with(i, extra);
    }

    /// Waits until node `i` (started) is ready and routes to every other node.
    pub async fn wait_up(&mut self, i: usize) {
        self.wait_ready(i).await;
        self.wait_routable(i, self.len() - 1).await;
    }
}
