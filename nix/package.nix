# callPackage-style derivation for claudebox.
#
#   nix build            (via ../flake.nix)
#   pkgs.callPackage ./nix/package.nix { }
{
  lib,
  stdenv,
  rustPlatform,
  makeBinaryWrapper,
  installShellFiles,
  bubblewrap,
}:

let
  cargoToml = lib.importTOML ../Cargo.toml;
in
rustPlatform.buildRustPackage {
  pname = "claudebox";
  inherit (cargoToml.package) version;

  # Only the crate itself, so edits to scripts, CI or Nix files do not rebuild.
  src = lib.fileset.toSource {
    root = ../.;
    fileset = lib.fileset.unions [
      ../Cargo.toml
      ../Cargo.lock
      ../src
      (lib.fileset.maybeMissing ../tests)
      # Cargo.toml declares the bench target, so cargo needs its file to read the manifest
      ../benches
      # src/policy/apparmor.rs includes the shipped AppArmor profile
      ../packaging/apparmor/claudebox-bwrap
      # src/cli/man.rs renders the man page's FILES, ENVIRONMENT, EXIT STATUS and EXAMPLES from it
      ../docs/reference.md
    ];
  };

  cargoLock.lockFile = ../Cargo.lock;

  nativeBuildInputs = [
    makeBinaryWrapper
    installShellFiles
  ];

  # The tests need unprivileged user namespaces (bubblewrap), which the Nix
  # build sandbox does not provide.
  doCheck = false;

  postInstall =
    lib.optionalString (stdenv.buildPlatform.canExecute stdenv.hostPlatform) ''
      installShellCompletion --cmd claudebox \
        --bash <($out/bin/claudebox completions bash) \
        --zsh <($out/bin/claudebox completions zsh) \
        --fish <($out/bin/claudebox completions fish)
      $out/bin/claudebox manpage > claudebox.1
      installManPage claudebox.1
    ''
    + ''
      # The AppArmor profile for Ubuntu-style kernels (apparmor_restrict_unprivileged_userns),
      # attached to the bwrap this package runs (the same line `claudebox --apparmor-profile`
      # replaces). NixOS: security.apparmor.policies.claudebox-bwrap.profile =
      #   builtins.readFile "''${pkgs.claudebox}/etc/apparmor.d/claudebox-bwrap";
      install -Dm644 ${../packaging/apparmor/claudebox-bwrap} $out/etc/apparmor.d/claudebox-bwrap
      substituteInPlace $out/etc/apparmor.d/claudebox-bwrap \
        --replace-fail '@{claudebox_bwrap} = /usr/bin/bwrap' '@{claudebox_bwrap} = "${bubblewrap}/bin/bwrap"'
      wrapProgram $out/bin/claudebox \
        --prefix PATH : ${lib.makeBinPath [ bubblewrap ]} \
        --set-default CLAUDEBOX_BWRAP ${bubblewrap}/bin/bwrap
    '';

  meta = {
    description = "Run Claude Code inside a per-project bubblewrap sandbox";
    license = lib.licenses.mit;
    mainProgram = "claudebox";
    platforms = lib.platforms.linux;
  };
}
