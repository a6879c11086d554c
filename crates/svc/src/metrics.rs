//! One declaration per metric: [`metrics!`](crate::metrics!) writes a service's metrics struct
//! and its registration from one entry each, so a metric's field, name and help are not spread
//! over a struct, a constructor and a `register` call.

/// Declares a metrics struct: one entry per metric (doc, field, type, constructor, name, help),
/// grouped by registry prefix. The struct gets `Default` (the metrics, unregistered) and
/// `register(&mut Registry) -> Self` (registered in entry order, each under its prefix).
///
/// ```
/// use prometheus_client::metrics::counter::Counter;
/// kjob_svc::metrics! {
///     /// The metrics of a demo.
///     #[derive(Clone, Debug)]
///     pub struct Metrics {
///         "demo" {
///             /// `demo_things_total`.
///             things: Counter = Counter::default(), "things", "Things done";
///         }
///     }
/// }
/// let mut registry = prometheus_client::registry::Registry::default();
/// let m = Metrics::register(&mut registry);
/// m.things.inc();
/// let mut out = String::new();
/// prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
/// assert!(out.contains("demo_things_total 1"));
/// ```
#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($prefix:literal {
                $($(#[$doc:meta])* $field:ident: $ty:ty = $new:expr, $metric:literal, $help:literal;)*
            })*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($($(#[$doc])* pub $field: $ty,)*)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $($($field: $new,)*)* }
            }
        }

        impl $name {
            /// Creates the metrics and registers them in `registry`, each under its prefix.
            pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
                let m = Self::default();
                $({
                    let r = registry.sub_registry_with_prefix($prefix);
                    $(r.register($metric, $help, m.$field.clone());)*
                })*
                m
            }
        }
    };
}
