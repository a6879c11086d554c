//! `kjob-queue`: the gRPC queue service (and `kjob-queue inspect`).

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::One, |mut args: kjob_queue::Args| async move {
        if let Some(kjob_queue::Command::Inspect { queue_url, queue, keys }) = args.command.take() {
            return kjob_queue::inspect(&queue_url, &queue, keys, &mut std::io::stdout()).await;
        }
        if let Some(kjob_queue::Command::RedisAcl { username, password }) = args.command.take() {
            println!("{}", kjob_workqueue::acl::acl_user_line(&username, &password));
            return Ok(());
        }
        let (listeners, config) = args.bind().await?;
        kjob_queue::run(listeners, config, kjob_svc::shutdown_on_signals()).await
    })
}
