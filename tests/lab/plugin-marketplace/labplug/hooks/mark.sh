#!/bin/sh
# The plugin's UserPromptSubmit hook: leaves a mark in the project and in the plugin's
# data dir, and says something that claude adds to the prompt.
echo ran >> "$PWD/plugin-hook-ran"
if [ -n "${CLAUDE_PLUGIN_DATA:-}" ]; then echo ran >> "$CLAUDE_PLUGIN_DATA/hook-ran"; fi
echo "PLUGIN-HOOK-CONTEXT-9034"
