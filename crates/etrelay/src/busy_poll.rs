//! `--busy-polling`: the relay's thread never sleeps while waiting for datagrams.
//!
//! A relay that sleeps in `epoll_wait` between datagrams gives its CPU back, and waking it
//! costs time: on a virtual machine most of all, where an idle virtual CPU is halted and must
//! be woken by the host. At an ET server's pace that wake-up, not the relay's work, is most of
//! what the relay adds to a round trip. With busy polling a task of the runtime yields in a
//! loop: the runtime then looks at its sockets and timers without blocking between every two
//! turns, so a datagram is read as soon as it arrives. The price is one CPU, busy all the time
//! (idle or not), which is why it is off unless asked for (HAProxy's `busy-polling` is the
//! same trade). BENCHMARKS.md gives both sides of it.

use tokio::task::JoinHandle;

/// The polling task; stopped when dropped.
#[derive(Debug)]
pub struct BusyPoll(JoinHandle<()>);

/// Starts polling on the current runtime. Must be called within it.
pub fn start() -> BusyPoll {
    BusyPoll(tokio::spawn(async {
        loop {
            // Back in the run queue after the runtime's other ready tasks and a look at its
            // sockets and timers that does not block.
            tokio::task::yield_now().await;
        }
    }))
}

impl Drop for BusyPoll {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Under busy polling the runtime still runs its other tasks, reads its sockets and fires
    /// its timers; dropping the guard ends the polling task.
    #[tokio::test(flavor = "current_thread")]
    async fn sockets_timers_and_tasks_still_run_and_the_guard_stops_it() {
        let poll = start();
        let a = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = b.local_addr().unwrap();
        let echo = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let (n, from) = b.recv_from(&mut buf).await.unwrap();
            b.send_to(&buf[..n], from).await.unwrap();
        });
        a.send_to(b"ping", to).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), a.recv(&mut buf))
            .await
            .expect("answered while polling")
            .unwrap();
        assert_eq!(&buf[..n], b"ping");
        echo.await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let handle = poll.0.abort_handle();
        drop(poll);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(handle.is_finished());
    }
}
