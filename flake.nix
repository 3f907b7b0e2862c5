{
  description = "claudebox: run Claude Code inside a per-project bubblewrap sandbox";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});
    in
    {
      overlays.default = final: prev: {
        claudebox = final.callPackage ./nix/package.nix { };
      };

      packages = forAllSystems (
        system: pkgs: {
          claudebox = pkgs.callPackage ./nix/package.nix { };
          default = self.packages.${system}.claudebox;
        }
      );

      apps = forAllSystems (
        system: pkgs: {
          default = {
            type = "app";
            program = "${self.packages.${system}.default}/bin/claudebox";
            meta.description = "Run Claude Code inside a per-project bubblewrap sandbox";
          };
        }
      );

      devShells = forAllSystems (
        system: pkgs: {
          default = pkgs.mkShell {
            packages = with pkgs; [
              cargo
              rustc
              clippy
              rustfmt
              bubblewrap
              git
              # npm, for scripts/install-agent.sh (the end-to-end test's claude)
              nodejs
            ];
            RUST_SRC_PATH = "${pkgs.rustPlatform.rustLibSrc}";
          };
        }
      );

      checks = forAllSystems (
        system: pkgs: {
          default = self.packages.${system}.default;
        }
      );
    };
}
