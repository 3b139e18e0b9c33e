// Package gobuild builds Go binaries the one way every builder in this
// repository shares: the non-race binaries tests start (proctest, the
// chaos and load tests, the version test), the container image's dedupesvc
// (internal/imagebuild, make image) and the adopter's guide's builds.
//
// The go command keys its build cache on the flags and environment a
// package is compiled with: CGO_ENABLED, -trimpath, -race and the tags
// change every dependency's key. Builders that differ compile every
// dependency once more each (issue 32: internal/imagebuild's static,
// -trimpath build cost 422 CPU-seconds of a cold make test recompiling what
// proctest had compiled with cgo and full paths). With one set they compile
// each dependency once; only the link differs (-ldflags). Build holds Lock,
// so that test processes building at the same time do not each compile what
// the other is compiling.
package gobuild
