//! A response body's pace (a route's `response_body_rate`, nginx's `limit_rate` and
//! `limit_rate_after`): its first `after` bytes go at once, then a piece goes only once
//! the rate allows all of it, counted from the response's start, so the client receives
//! `after + per_second × elapsed` bytes at most and, when it keeps reading, about that.
//!
//! One timer per paced response, set only when a piece must wait: a body whose pieces are
//! within the rate costs no timer at all.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::config::BodyRate;

/// The largest piece sent at once: an eighth of a second's worth, at least 1 KiB, so a
/// paced body flows in small steps, not in bursts of what the upstream read returned.
pub fn piece_bytes(rate: BodyRate) -> usize {
    usize::try_from(rate.per_second / 8).unwrap_or(usize::MAX).clamp(1024, 64 * 1024)
}

pub struct Pacer {
    rate: BodyRate,
    start: Instant,
    sent: u64,
    /// Boxed: set only once a piece had to wait.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Pacer {
    pub fn new(rate: BodyRate) -> Self {
        Pacer { rate, start: Instant::now(), sent: 0, timer: None }
    }

    pub fn rate(&self) -> BodyRate {
        self.rate
    }

    /// Ready once `n` more bytes may go out; counts them as sent then.
    pub fn poll_send(&mut self, cx: &mut Context<'_>, n: usize) -> Poll<()> {
        let total = self.sent + n as u64;
        let paced = total.saturating_sub(self.rate.after);
        if paced > 0 {
            // (Past what an `Instant` can hold, it is never due: a year is as good.)
            let wait = Duration::try_from_secs_f64(paced as f64 / self.rate.per_second as f64);
            let due = wait.ok().and_then(|w| self.start.checked_add(w));
            let due = due.unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 86_400));
            if due > Instant::now() {
                let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                if timer.deadline() != due {
                    timer.as_mut().reset(due);
                }
                std::task::ready!(timer.as_mut().poll(cx));
            }
        }
        self.sent = total;
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Pacer {
        /// Waits until `n` more bytes may go out, and counts them.
        async fn send(&mut self, n: usize) {
            std::future::poll_fn(|cx| self.poll_send(cx, n)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_bytes_go_at_once_then_the_rest_at_the_rate() {
        let rate = BodyRate { per_second: 1000, after: 500 };
        let mut pacer = Pacer::new(rate);
        let start = Instant::now();
        pacer.send(500).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "`after` bytes go at once");
        pacer.send(250).await;
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        for _ in 0..4 {
            pacer.send(250).await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(1250), "1 750 bytes: 500 at once, 1 250 at 1 000/s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_fell_behind_catches_up_without_waiting() {
        let mut pacer = Pacer::new(BodyRate { per_second: 1000, after: 0 });
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        pacer.send(2000).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        pacer.send(1000).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[test]
    fn pieces_are_an_eighth_of_a_second_within_bounds() {
        let piece = |per_second| piece_bytes(BodyRate { per_second, after: 0 });
        assert_eq!((piece(100), piece(80_000), piece(10_000_000)), (1024, 10_000, 64 * 1024));
    }
}
