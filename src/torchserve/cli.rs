//! TorchServe's command line as its users type it out of habit (`torchserve --start
//! --model-store model_store --models resnet-18.mar --ts-config config.properties`):
//! refused before the options are parsed, naming what does the same here, instead of an
//! "unexpected argument" that names nothing.

/// TorchServe's options and what does the same here.
const OPTIONS: &[(&str, &str)] = &[
    ("--start", "`app --production` runs the server, in the foreground (`app` alone: a development server); there is no separate start"),
    ("--stop", "send the master SIGTERM (as systemd and Kubernetes do) to stop it"),
    ("--foreground", "`app` always runs in the foreground"),
    ("--model-store", "set the metadata's `model` to the model store's folder (its one archive is served; config.properties beside model-store/ is read) or to a .mar"),
    ("--models", "set the metadata's `model` to the .mar (one server serves one archive)"),
    ("--ts-config", "a model store's config.properties is read from the store (set the metadata's `model` to the store's folder); its server settings map onto options (docs/migrating.md, \"Coming from TorchServe\")"),
    ("--ncs", "vramfork keeps no config snapshots: nothing to turn off"),
    ("--no-config-snapshots", "vramfork keeps no config snapshots: nothing to turn off"),
    ("--disable-token-auth", "token auth is off unless --api-key-file is given"),
    ("--enable-model-api", "the management API is read-only here (GET /models); one server serves one model"),
    ("--workflow-store", "vramfork serves no workflows: one server per model"),
];

/// The first of TorchServe's options in `args` (the command line without the program), as
/// an error naming what to do instead.
pub fn habit(args: &[String]) -> Option<String> {
    args.iter().find_map(|a| {
        let flag = a.split('=').next().unwrap_or(a);
        OPTIONS
            .iter()
            .find(|(f, _)| *f == flag)
            .map(|(f, instead)| {
                format!("`{f}` is TorchServe's option, which vramfork does not take: {instead}")
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchserves_options_name_what_does_the_same_here() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = habit(&args(&["--start", "--model-store", "ms"])).unwrap();
        assert!(
            e.contains("`--start` is TorchServe's option") && e.contains("app --production"),
            "{e}"
        );
        let e = habit(&args(&["--ts-config=config.properties"])).unwrap();
        assert!(e.contains("`--ts-config`"), "{e}");
        assert_eq!(habit(&args(&["--production", "--workers", "2"])), None);
    }
}
