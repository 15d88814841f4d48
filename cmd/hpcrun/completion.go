package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

const bashCompletion = `# bash completion for hpcrun; source it or put it in /etc/bash_completion.d
_hpcrun_complete() {
	local cur opts
	cur="${COMP_WORDS[COMP_CWORD]}"
	opts=$("${COMP_WORDS[0]}" "${COMP_WORDS[@]:1:$COMP_CWORD-1}" --generate-bash-completion 2>/dev/null)
	COMPREPLY=($(compgen -W "${opts}" -- "${cur}"))
	return 0
}
complete -o default -F _hpcrun_complete hpcrun
`

const zshCompletion = `#compdef hpcrun
_hpcrun() {
	local -a opts
	opts=("${(@f)$(${words[1]} ${words[@]:1:$CURRENT-2} --generate-bash-completion 2>/dev/null)}")
	_describe 'values' opts
}
compdef _hpcrun hpcrun
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash or zsh)",
		ArgsUsage: "bash|zsh",
		Action: func(c *cli.Context) error {
			switch shell := c.Args().First(); shell {
			case "", "bash":
				fmt.Fprint(c.App.Writer, bashCompletion)
			case "zsh":
				fmt.Fprint(c.App.Writer, zshCompletion)
			default:
				return cli.Exit(fmt.Sprintf("completion: unknown shell %q; use bash or zsh", shell), 2)
			}
			return nil
		},
	}
}
