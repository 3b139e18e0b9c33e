// Package cliflag gives every idemgate command one way to read its flags
// and their environment variables, on the standard library's flag package.
//
// A command defines its flags on a *flag.FlagSet as usual, binds them with
// Bind, parses the command line, then calls Apply. The rule is the same for
// every flag of every command:
//
//   - each flag reads one variable: the command's prefix and the flag's
//     name upper-cased with '-' as '_' (prefix IDEMGATE_ and
//     -caller-begin-rate read IDEMGATE_CALLER_BEGIN_RATE), unless WithName
//     names it otherwise (a documented name such as DATABASE_URL);
//   - a flag given on the command line wins, and its variable is not read;
//   - otherwise a set variable is applied through the flag's own flag.Value
//     Set, so a variable parses exactly as the flag would: one set to the
//     empty string is the flag given as -flag= (an empty string flag; an
//     error for a flag that refuses "", as a number or a duration does),
//     and only an unset variable leaves the flag at its default;
//   - a variable that does not parse is an error naming the variable, its
//     value and its flag, and all of them are reported together;
//   - the usage text shows each flag's variable, "(env NAME)".
package cliflag
