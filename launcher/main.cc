// mqaserve: the server binary. Started by mpirun or srun; every rank runs this main.
#include <cstdio>

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "mqaserve: the serving path is not built yet\n");
  return 2;
}
