//! The batched delete of retention (`outbox retention`), once for every SQL database: one
//! statement deleting at most `batch` delivered rows at a time, a pause between statements,
//! progress reported after each full batch, until a batch comes back short or the operator
//! stops the run. The database supplies the statement.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use crate::admin::RetentionReport;

/// Runs `delete_batch` (one statement deleting at most the given number of rows; it returns
/// how many it deleted) with batches of `batch` rows (at least 1), sleeping `pause` between
/// statements, and counts the statements and rows in `report`. `progress` gets the rows
/// deleted so far after each full batch; `Break` stops the run (`report.stopped`). A short
/// batch ends it: nothing eligible is left.
pub async fn delete_in_batches<E, F>(
    batch: u32,
    pause: Duration,
    progress: &mut (dyn FnMut(u64) -> ControlFlow<()> + Send),
    report: &mut RetentionReport,
    mut delete_batch: impl FnMut(u32) -> F,
) -> Result<(), E>
where
    F: Future<Output = Result<u64, E>>,
{
    let batch = batch.max(1);
    loop {
        let n = delete_batch(batch).await?;
        report.batches += 1;
        report.deleted += n;
        if n < u64::from(batch) {
            return Ok(());
        }
        if progress(report.deleted).is_break() {
            report.stopped = true;
            return Ok(());
        }
        tokio::time::sleep(pause).await;
    }
}
