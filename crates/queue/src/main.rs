//! `kjob-queue`: the gRPC queue service (and `kjob-queue inspect`, `kjob-queue certs`,
//! `kjob-queue redis-acl`).

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::One, |mut args: kjob_queue::Args| async move {
        let stdout = &mut std::io::stdout();
        match args.command.take() {
            Some(kjob_queue::Command::Inspect { queue_url, queue, keys, top, namespace, tls }) => {
                let args = kjob_queue::InspectArgs { queue, keys, top, namespace };
                kjob_queue::inspect(&queue_url, &tls, args, stdout).await
            }
            Some(kjob_queue::Command::Certs { out, hosts, namespace }) => {
                kjob_queue::certs(&out, hosts, &namespace, stdout)
            }
            Some(kjob_queue::Command::RedisAcl { username, password }) => {
                println!("{}", kjob_workqueue::acl::acl_user_line(&username, &password));
                Ok(())
            }
            None => {
                let (listeners, config) = args.bind().await?;
                kjob_queue::run(listeners, config, kjob_svc::shutdown_on_signals()).await
            }
        }
    })
}
