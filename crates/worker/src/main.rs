//! `kjob-worker` binary: parse flags, set up logging, run the worker library until a signal.

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::One, |args: kjob_worker::Args| async move {
        let (listeners, config) = args.bind().await?;
        kjob_worker::run(listeners, config, kjob_svc::shutdown_on_signals()).await
    })
}
