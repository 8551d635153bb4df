//! The ids by which the request path names a route, a limit and an upstream: each its
//! place in the compiled configuration's table of them (`Config::routes`, `limits`,
//! `upstreams`), and in every table kept beside it in the same order (the limiters, the
//! metrics, `simulate`'s tallies). The tables are `TiVec`s indexed by their id only, so
//! that a route's index can never be read as a limit's.

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(u32);

        impl $name {
            /// Its place in its table.
            #[inline]
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl From<usize> for $name {
            /// The id at `index`; a compiled configuration holds far fewer than 2³²
            /// routes, limits or upstreams (its file would be gigabytes).
            #[inline]
            fn from(index: usize) -> $name {
                $name(u32::try_from(index).expect("a table holds fewer than 2^32 entries"))
            }
        }

        impl From<$name> for usize {
            #[inline]
            fn from(id: $name) -> usize {
                id.index()
            }
        }
    };
}

id!(
    /// A route: its place in `Config::routes`, the order routes are tried in.
    RouteId
);
id!(
    /// A limit: its place in `Config::limits` (the order routes lock them in).
    LimitId
);
id!(
    /// An upstream: its place in `Config::upstreams`.
    UpstreamId
);
