from trtbuild.cli import main

main()
