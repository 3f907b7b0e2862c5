pub const _X: () = ();
