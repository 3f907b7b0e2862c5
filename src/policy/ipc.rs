//! Host IPC endpoints the sandbox must not reach, named by environment variables. The
//! sockets themselves stay out of reach because `/run`, `$XDG_RUNTIME_DIR` and the host's
//! `/tmp` are not mounted; these variables are not passed in either, so nothing inside is
//! pointed at them.

/// Variables naming a socket or bus of the host session, with what is behind them.
pub const HOST_IPC_VARS: &[(&str, &str)] = &[
    ("SSH_AUTH_SOCK", "ssh agent: signs with your ssh keys"),
    ("SSH_AGENT_PID", "ssh agent"),
    ("GPG_AGENT_INFO", "gpg agent"),
    ("GNOME_KEYRING_CONTROL", "GNOME keyring"),
    ("DBUS_SESSION_BUS_ADDRESS", "D-Bus session bus"),
    ("DBUS_SYSTEM_BUS_ADDRESS", "D-Bus system bus"),
    ("WAYLAND_DISPLAY", "Wayland compositor"),
    ("WAYLAND_SOCKET", "Wayland compositor"),
    ("DISPLAY", "X11 server: keystrokes into other windows"),
    ("XAUTHORITY", "X11 cookie"),
    (
        "XDG_RUNTIME_DIR",
        "per-user runtime dir holding the session's sockets",
    ),
    ("DOCKER_HOST", "docker daemon: root on the host"),
    ("CONTAINER_HOST", "podman service"),
    ("BUILDKIT_HOST", "buildkit daemon"),
    ("PULSE_SERVER", "PulseAudio"),
    ("PIPEWIRE_REMOTE", "PipeWire"),
    ("SWAYSOCK", "sway IPC: runs commands in the session"),
    ("I3SOCK", "i3 IPC: runs commands in the session"),
    ("NIRI_SOCKET", "niri IPC"),
    ("HYPRLAND_INSTANCE_SIGNATURE", "Hyprland IPC"),
    (
        "KITTY_LISTEN_ON",
        "kitty remote control: types into terminals",
    ),
    ("WEZTERM_UNIX_SOCKET", "WezTerm mux"),
    ("NVIM", "the parent Neovim's RPC socket"),
    ("NVIM_LISTEN_ADDRESS", "Neovim RPC socket"),
    (
        "VSCODE_IPC_HOOK_CLI",
        "VS Code: opens and runs things in the editor",
    ),
    ("VSCODE_GIT_IPC_HANDLE", "VS Code git credential socket"),
    ("NOTIFY_SOCKET", "systemd notification socket"),
    ("KRB5CCNAME", "Kerberos credential cache"),
];
