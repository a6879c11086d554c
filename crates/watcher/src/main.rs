//! `kjob-watcher`: watches Jobs and Pods and feeds kjob-queue (see the library docs).

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::One, |args: kjob_watcher::Args| async move {
        let (listeners, config) = args.bind().await?;
        kjob_watcher::run(listeners, config, kjob_svc::shutdown_on_signals()).await
    })
}
