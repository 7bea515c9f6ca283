// Command rebuno is the Rebuno kernel and its command-line client.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes (docs/protocol/configuration.md §3, §6.2).
const (
	exitOK      = 0
	exitRuntime = 1
	exitConfig  = 2
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := &cobra.Command{
		Use:           "rebuno",
		Short:         "Rebuno: a durable execution runtime for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(devCommand(), serverCommand(), migrateCommand(), storeCommand(), versionCommand())
	root.AddCommand(clientCommands()...)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(os.Stderr, "error:", err)
	var ce *configError
	if errors.As(err, &ce) || isUsageError(err) {
		return exitConfig
	}
	return exitRuntime
}

// isUsageError recognises cobra's own argument and flag errors.
func isUsageError(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

type usageError struct{ error }

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "rebuno %s\n", version)
		},
	}
}
